"""Issue 25's table: real JPEGs at the speed of the GPU? One invocation, one table.

    python bench/gpu_images.py make --root /tmp/jpegs --val 5000      # ImageNet-like, ~500x375 q90
    python bench/gpu_images.py run --root /tmp/jpegs --gpus 1 2 4 --out /tmp/out/gpu_images.json
    python bench/gpu_images.py check --root /tmp/jpegs                 # (run does it first)
    python bench/gpu_images.py --smoke                                 # the code on the CPU, tiny

ResNet-50, 224 px, bf16, batch 256 per GPU, SGD (bench/images_bench.py's COMMON); at each GPU
count every contender runs bound to the same cores, at most --cores-per-gpu (16) per GPU (this
process's affinity, inherited by what it starts):

- ``synthetic``: data=synthetic held on the GPU, the ceiling;
- ``pillow``: data=image_folder, data.decode=cpu (Pillow in the DataLoader workers);
- ``nvjpeg``: data.decode=gpu (torchvision's batched nvJPEG in the training process);
- ``nvimgcodec``: data.decode=nvimgcodec (nvImageCodec, the GPU's JPEG engines where it has them);
- ``auto``: data.decode=auto, what a user gets (its first log line says which and why);
- ``torchvision``: bench/raw_images.py, ImageFolder + PIL + DataLoader (torchrun for DDP).

Columns: img/s, / synthetic, CPU seconds per image (user + system of every process the run
started, start-up included) and the data path's share (that minus synthetic's, same GPU count),
and the data part of the run's first log line. First `check`: the device path's batches equal
the CPU path's within 6 grey levels an image (else the run stops), and its decode rate. Then validation: one pass over the val/ folder
(centre crop, ResNet-50 forward in bf16, this process, one GPU) per decoder, its ms per image
against the training ms per image of the same decoder at 1 GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from harness import _json_line, _run
from images_bench import COMMON, expctl_img_s, make

HERE = Path(__file__).resolve().parent
DECODERS = {"pillow": "cpu", "nvjpeg": "gpu", "nvimgcodec": "nvimgcodec", "auto": "auto"}
SMOKE = [
    "model=resnet18", "optim=sgd", "optim.lr=0.1", "sched=none", "data.batch_size=4",
    "train.val_every=100000", "train.max_epochs=100000",
    "train.limit_val_batches=1", "checkpoint.every=1000000", "train.device=cpu",
]  # fmt: skip


def _cpu_seconds() -> float:
    """User + system seconds of the finished processes this one started (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _said(e: Exception) -> str:
    """A failed run's error line (expctl's one-line error where there is one)."""
    if isinstance(getattr(e, "message", None), str):  # a UserError in this process
        return str(e.message)[:200]  # type: ignore[attr-defined]
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return next((x for x in lines if x.startswith("expctl: error")), lines[-1])[:200]


def _bound(cores: list[int], fn: Callable[[], tuple[float, str]]) -> tuple[float, str, float]:
    """fn() run on `cores` (its processes inherit them), with the CPU seconds it took."""
    before, cpu = os.sched_getaffinity(0), _cpu_seconds()
    os.sched_setaffinity(0, cores)
    try:
        rate, how = fn()
    finally:
        os.sched_setaffinity(0, before)
    return rate, how, _cpu_seconds() - cpu


def _raw(a: argparse.Namespace, gpus: int, env: dict[str, str]) -> tuple[float, str]:
    """bench/raw_images.py on this process's cores: one GPU, or torchrun's DDP."""
    args = ["--root", str(a.root / "train"), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    if a.smoke:
        args += ["--device", "cpu", "--model", "resnet18", "--size", "32", "--batch", "4"]
    start = [sys.executable, str(HERE / "raw_images.py")]
    if gpus > 1:
        start = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={gpus}", str(HERE / "raw_images.py")]  # fmt: skip
    out = _run([*start, *args], env, 1200)[0]
    workers = max(1, len(os.sched_getaffinity(0)) // gpus)
    return float(_json_line(out)["samples_per_s"]), f"DataLoader, {workers} workers per GPU"


def train_rows(a: argparse.Namespace, env: dict[str, str]) -> list[dict[str, Any]]:
    common = SMOKE if a.smoke else COMMON
    extra = a.expctl_args.split() if a.expctl_args else []
    folder = ["data=image_folder", f"data.root={a.root}", *extra]
    folder += ["data.image_size=32"] if a.smoke else []
    synthetic = ["data=synthetic", f"data.shape=[3,{32 if a.smoke else 224},{32 if a.smoke else 224}]",
                 "data.num_samples=3072", "data.val_samples=256", *extra]  # fmt: skip
    available = sorted(os.sched_getaffinity(0))
    rows: list[dict[str, Any]] = []
    for gpus in a.gpus:
        cores = available[: min(len(available), a.cores_per_gpu * gpus)]
        runs: dict[str, Callable[[], tuple[float, str]]] = {
            "synthetic": lambda g=gpus: expctl_img_s(synthetic, g, a.steps, a.warmup, env, common)
        }
        for name, decode in DECODERS.items():
            runs[name] = lambda g=gpus, d=decode: expctl_img_s(
                [*folder, f"data.decode={d}"], g, a.steps, a.warmup, env, common
            )
        runs["torchvision"] = lambda g=gpus: _raw(a, g, env)
        for name, fn in runs.items():
            if a.only and name not in a.only:
                continue
            try:
                rate, how, cpu = _bound(cores, fn)
            except Exception as e:  # one contender's failure is a row, not the end of the table
                rate, how, cpu = float("nan"), f"FAILED: {_said(e)}", 0.0
            batch = 4 if a.smoke else 256
            images = a.steps * batch * gpus
            rows.append({"gpus": gpus, "cores": len(cores), "contender": name, "img_s": rate,
                         "cpu_s_per_img": cpu / images, "how": how})  # fmt: skip
            print(f"{gpus} GPU {len(cores)} cores  {name:12s} {rate:8.0f} img/s  "
                  f"{1000 * cpu / images:6.2f} CPU ms/img  {how}", flush=True)  # fmt: skip
    return rows


def val_rows(a: argparse.Namespace) -> list[dict[str, Any]]:
    """One validation pass over val/ per decoder, in this process on one GPU, its cores bound."""
    import torch  # noqa: PLC0415 - the training rows run without torch in this process
    import torchvision  # noqa: PLC0415

    from expctl.builtin.datasets.images import image_folder  # noqa: PLC0415
    from expctl.builtin.reader import Loading  # noqa: PLC0415
    from expctl.rank.batches import auto_workers, val_batches  # noqa: PLC0415

    device = torch.device("cpu" if a.smoke else "cuda:0")
    size, batch = (32, 4) if a.smoke else (224, 256)
    cores = sorted(os.sched_getaffinity(0))[: a.cores_per_gpu]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    model = torchvision.models.resnet50(num_classes=100).to(device).eval()
    model = model.to(memory_format=torch.channels_last)
    rows = []
    try:
        for name, decode in DECODERS.items():
            if a.only and name not in a.only:
                continue
            try:
                s = image_folder(root=str(a.root), image_size=size, decode=decode, device=device)
                assert s.val is not None
                loading = Loading(auto_workers(1), device.type == "cuda" and decode == "cpu")
                start, n = time.perf_counter(), 0
                with torch.no_grad(), torch.autocast(device.type, torch.bfloat16):
                    for x, _ in val_batches(s.val, batch, 0, 1, device, loading):
                        model(x)
                        n += len(x)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds, how = time.perf_counter() - start, ""
            except Exception as e:
                n, seconds, how = 0, float("nan"), f"FAILED: {_said(e)}"
            rows.append({"contender": name, "images": n, "seconds": seconds, "how": how})
            print(f"validation {name:12s} {n} images in {seconds:.1f} s {how}", flush=True)
    finally:
        os.sched_setaffinity(0, before)
    return rows


def _first(batches: Any) -> Any:
    """The first batch of `batches` (TrainBatches), its reader's workers ended after."""
    with closing(batches.epoch(1)) as epoch:
        first = next(epoch)
    if batches.reader is not None:
        batches.reader.close()
    return first


def check(a: argparse.Namespace) -> None:
    """Before the table: the device path's batches against the CPU path's for the same seeds
    (each image within 10 grey levels, mean absolute; labels equal; channels_last), train and validation, with workers;
    then one batch of 256 train/ JPEGs through `on_device` alone (one thread): img/s."""
    import torch  # noqa: PLC0415

    from expctl.builtin.datasets.gpuimages import DeviceDecoded, nvimgcodec_missing  # noqa: PLC0415
    from expctl.builtin.datasets.imagefiles import ImageFiles  # noqa: PLC0415
    from expctl.builtin.datasets.images import _pick_decode, image_folder  # noqa: PLC0415
    from expctl.builtin.reader import Loading, Reader  # noqa: PLC0415
    from expctl.rank.batches import TrainBatches, val_batches  # noqa: PLC0415

    device = torch.device("cpu" if a.smoke else "cuda:0")
    cpu = torch.device("cpu")
    print(
        "nvImageCodec:", nvimgcodec_missing() or "imports", "| auto:", _pick_decode("auto", device)
    )
    t = image_folder(root=str(a.root), image_size=224).train
    samples = t.samples[:64]  # type: ignore[attr-defined]
    k = len(samples)
    norm = t.normalize  # type: ignore[attr-defined]
    decoders = ["gpu"] + ([] if nvimgcodec_missing() else ["nvimgcodec"])
    for dec in decoders:
        for train in (True, False):
            ref = ImageFiles(samples, 224, 3, train, "imagenet", norm)
            dev = DeviceDecoded(samples, 224, 3, train, "imagenet", norm, dec)
            if train:
                xa, ya = _first(TrainBatches(ref, k, 0, 1, 5, cpu, Loading(0)))
                xg, yg = _first(TrainBatches(dev, k, 0, 1, 5, device, Loading(2)))
            else:
                reader = Reader({"val": dev}, Loading(2), 0, 0)
                xa, ya = next(val_batches(ref, k, 0, 1, cpu))
                with closing(val_batches(dev, k, 0, 1, device, reader=reader)) as batches:
                    xg, yg = next(batches)
                reader.close()
            grey = (xg.cpu() - xa).abs().mean(dim=(1, 2, 3)) * 0.226 * 255
            ok = torch.equal(ya, yg.cpu()) and xg.is_contiguous(memory_format=torch.channels_last)
            print(f"check {dec} {'train' if train else 'val'}: labels and layout {ok}, "
                  f"grey levels off the CPU path: mean {float(grey.mean()):.2f} max {float(grey.max()):.2f}")  # fmt: skip
            # a wrong box or flip is tens of levels off; the CPU path decodes an image over twice
            # the crop's size at 1/2 scale (libjpeg's DCT scaling), up to ~7 levels off a full
            # decode on these noisy images (SHAPES=imagenet: 6.45 on the CPU, before and after
            # gpucrop, stop 44)
            if not ok or float(grey.max()) > 10:
                raise SystemExit(f"check failed: {dec}")
        dev = DeviceDecoded(t.samples[:256], 224, 3, True, "imagenet", norm, dec)  # type: ignore[attr-defined]
        start = time.perf_counter()
        batch = dev.collate([dev[i] for i in range(len(dev))])
        worker = (time.perf_counter() - start) / len(dev)
        for i in range(4):
            if i == 1:
                torch.cuda.synchronize() if device.type == "cuda" else None
                start = time.perf_counter()
            dev.on_device(batch, device)
        torch.cuda.synchronize() if device.type == "cuda" else None
        per = (time.perf_counter() - start) / 3 / len(dev)
        print(f"check {dec}: on_device {1 / per:,.0f} img/s (one thread); the worker's part "
              f"{1000 * worker:.2f} ms/img")  # fmt: skip


def table(train: list[dict[str, Any]], val: list[dict[str, Any]]) -> str:
    lines = ["| GPUs | cores | contender | img/s | / synthetic | CPU ms/img | data path CPU ms/img | how |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in train:
        same = (b for b in train if b["gpus"] == r["gpus"] and b["contender"] == "synthetic")
        base = next(same, None)
        ratio = r["img_s"] / base["img_s"] if base else float("nan")
        ok = base is not None and r["img_s"] == r["img_s"]  # (nan: a failed run)
        own = 1000 * (r["cpu_s_per_img"] - base["cpu_s_per_img"]) if ok else float("nan")  # type: ignore[index]
        lines.append(f"| {r['gpus']} | {r['cores']} | {r['contender']} | {r['img_s']:,.0f} | "
                     f"{ratio:.3f} | {1000 * r['cpu_s_per_img']:.2f} | {own:.2f} | {r['how']} |")  # fmt: skip
    if val:
        lines += ["", "| validation | images | s | ms/img | training ms/img (1 GPU) | how |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for v in val:
            t = next((r for r in train if r["gpus"] == min(x["gpus"] for x in train)
                      and r["contender"] == v["contender"]), None)  # fmt: skip
            per = 1000 * v["seconds"] / v["images"] if v["images"] else float("nan")
            tr = 1000 / t["img_s"] if t and t["img_s"] else float("nan")
            lines.append(f"| {v['contender']} | {v['images']} | {v['seconds']:.1f} | {per:.3f} | "
                         f"{tr:.3f} | {v['how']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", nargs="?", choices=("make", "check", "run"), default="run")
    p.add_argument("--root", type=Path)
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--val", type=int, default=5000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument(
        "--shapes",
        choices=("four", "imagenet"),
        default="four",
        help="make: four sizes, or as many as ImageNet's (images_bench._size)",
    )
    p.add_argument("--gpus", type=int, nargs="+", default=[1])
    p.add_argument("--cores-per-gpu", type=int, default=16)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--only", nargs="*", default=None, help="contenders (and validations) to run")
    p.add_argument("--no-val", action="store_true", help="no validation pass")
    p.add_argument("--expctl-args", default="", help="more overrides, e.g. 'train.compile=true'")
    p.add_argument("--out", type=Path, help="the rows as JSON")
    p.add_argument("--smoke", action="store_true", help="the code on the CPU: tiny data and runs")
    a = p.parse_args()
    made = None
    if a.smoke and a.root is None:
        a.root = made = Path(tempfile.mkdtemp(prefix="gpu-images-smoke-"))
    try:
        _main(a, p)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _main(a: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    if a.smoke:
        a.train, a.val, a.classes, a.steps, a.warmup, a.gpus = 48, 8, 4, 6, 2, [1]
        if not (a.root / "train").is_dir():
            make(a.root, a.train, a.val, a.classes)
    elif a.root is None:
        p.error("--root is required")
    if a.cmd == "make":
        make(a.root, a.train, a.val, a.classes, a.shapes)
        return
    check(a)
    if a.cmd == "check":
        return
    env = dict(os.environ)
    train = train_rows(a, env)
    val = [] if a.no_val else val_rows(a)
    text = table(train, val)
    print("\n" + text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"train": train, "validation": val}, indent=1))


if __name__ == "__main__":
    main()
