"""Does JPEG decoding on the GPU overlap a training step? (issue 25)

    python bench/decode_overlap.py            # on a CUDA machine; makes 256 JPEGs in /tmp

ResNet-50 224 bf16 channels_last, batch 256, SGD, on a GPU-resident batch: the step time alone,
then while another thread decodes batches of the same 256 JPEGs (~500x375) without pause, by
torchvision's nvJPEG, by nvImageCodec restricted to its hardware backend (the JPEG engines) and
to its CUDA backend, and by `DeviceDecoded.on_device` (decode + crop + normalise). Printed per
decoder: its img/s alone, the step time, its slowdown, and the decode thread's img/s meanwhile.
A decoder on the JPEG engines should slow the step little; one on the SMs takes their time from it.

    python bench/decode_overlap.py --procs 4   # the same in 4 processes at once, one per GPU,
                                               # 16 cores each, each phase started together
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import threading
import time
from pathlib import Path

import torch
import torchvision
from images_bench import make

from expctl.builtin.datasets.gpuimages import DeviceDecoded, nvimgcodec_inputs
from expctl.builtin.datasets.images import image_folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--procs", type=int, default=1)
    p.add_argument("--cores", type=int, default=16, help="cores per process (--procs > 1)")
    p.add_argument("--only", default="", help="decoders to run, comma-separated (default: all)")
    p.add_argument("--compile", action="store_true", help="the step's model under torch.compile")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="overlap-"))
    make(root, 256, 0, 4)
    if a.procs == 1:
        measure(root, a.only, None, "", a.compile)
        return
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(a.procs)
    procs = [
        ctx.Process(target=child, args=(i, a.cores, root, a.only, barrier, a.compile))
        for i in range(a.procs)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()


def child(i: int, per: int, root: Path, only: str, barrier: object, compiled: bool) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = str(i)  # before this process's first CUDA call
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cores[i * per : (i + 1) * per] or cores)
    measure(root, only, barrier, f"gpu {i}: ", compiled)


def measure(root: Path, only: str, barrier: object, tag: str, compiled: bool = False) -> None:
    def together() -> None:
        if barrier is not None:
            barrier.wait()  # type: ignore[attr-defined]

    files = sorted((root / "train").rglob("*.jpg"))
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    dev = torch.device("cuda:0")
    model = torchvision.models.resnet50().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if compiled:  # a shorter step: does decoding beside it cost it more?
        model = torch.compile(model)
    x = torch.randn(256, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device=dev)

    def steps(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            with torch.autocast("cuda", torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1000

    decoders = {"nvjpeg": lambda: torchvision.io.decode_jpeg(data, device=dev)}
    try:
        from nvidia import nvimgcodec

        for name, kind in (("nvimgcodec hw", "HW_GPU_ONLY"), ("nvimgcodec cuda", "GPU_ONLY")):
            try:
                d = nvimgcodec.Decoder(
                    device_id=0, max_num_cpu_threads=4,
                    backends=[nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind))],
                )  # fmt: skip
            except RuntimeError as e:  # no JPEG engines here (or not exposed to this container)
                print(f"{name}: no decoder: {e}")
                continue

            def run(d=d) -> list:  # type: ignore[no-untyped-def]
                streams, params = nvimgcodec_inputs(data, 3)
                s = torch.cuda.current_stream(dev).cuda_stream
                out = d.decode(streams, params=params, cuda_stream=s)
                if any(o is None for o in out):
                    raise RuntimeError(f"{sum(o is None for o in out)} of {len(out)} not decoded")
                return [torch.as_tensor(o, device=dev) for o in out]

            decoders[name] = run
    except ImportError as e:
        print("nvImageCodec:", e)
    t = image_folder(root=str(root), image_size=224, val=None).train
    for name, kind in (("on_device gpu", "gpu"), ("on_device nvimgcodec", "nvimgcodec")):
        ds = DeviceDecoded(t.samples, 224, 3, True, "imagenet", t.normalize, kind)  # type: ignore[attr-defined]
        batch = ds.collate([ds[i] for i in range(len(ds))])
        decoders[name] = lambda ds=ds, batch=batch: ds.on_device(batch, dev)
    if only:
        decoders = {k: v for k, v in decoders.items() if k in only.split(",")}
    steps(15)
    together()
    alone = steps(20)
    print(f"{tag}step alone: {alone:.1f} ms", flush=True)
    for name, fn in decoders.items():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{tag}{name}: fails: {e}")
            fn = None
        together()  # every process, even one whose decoder failed
        if fn is None:
            together()
            continue
        torch.cuda.synchronize()
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 1.5:
            fn()
            torch.cuda.synchronize()
            n += 256
        solo = n / (time.perf_counter() - t)
        together()
        stop, count = threading.Event(), [0, 0.0]

        def loop(fn=fn, stop=stop, count=count) -> None:  # type: ignore[no-untyped-def]
            stream = torch.cuda.Stream(dev)
            t = time.perf_counter()
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    fn()
                    stream.synchronize()
                    count[0] += 256
            count[1] = time.perf_counter() - t

        th = threading.Thread(target=loop)
        th.start()
        time.sleep(0.5)
        with_decode = steps(20)
        stop.set()
        th.join()
        rate = count[0] / count[1]
        print(f"{tag}{name:16s} alone {solo:,.0f} img/s; step {with_decode:.1f} ms "
              f"({with_decode / alone:.2f}x), decoding {rate:,.0f} img/s meanwhile", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
