"""Where does 2-GPU scaling go? Same ResNet-18 bf16 step, four ways, printed as samples/s per GPU:

  alone      one process on GPU 0, the other GPU idle
  side-by-side  two independent processes (no DDP), one per GPU, at the same time
  ddp        two processes, DDP (NCCL all-reduce of the gradients)
  ddp+nosync two processes, DDP inside no_sync() (no all-reduce): DDP's own cost without comms
plus NCCL all-reduce time of a gradient-sized (45 MB fp32) buffer, and a torch.profiler table
of rank 0's DDP steps.

    torchrun --nproc_per_node=2 bench/scaling_probe.py ddp      (the harness of this file runs all)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch


def step_rate(mode: str, steps: int = 120, warmup: int = 40, batch: int = 512) -> float:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchvision.models import resnet18

    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    model = resnet18(num_classes=10).to(device).to(memory_format=torch.channels_last)
    if mode.startswith("ddp"):
        dist.init_process_group("nccl")
        kw = (
            {"bucket_cap_mb": 100}
            if mode == "ddp-bucket100"
            else {"static_graph": True}
            if mode == "ddp-static"
            else {}
        )
        model = DDP(model, device_ids=[local], gradient_as_bucket_view=True, **kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    x = torch.randn(batch, 3, 32, 32, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = torch.nn.CrossEntropyLoss()
    prof = None
    for i in range(steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if mode == "ddp" and local == 0 and os.environ.get("PROFILE"):
                prof = torch.profiler.profile(
                    activities=[
                        torch.profiler.ProfilerActivity.CPU,
                        torch.profiler.ProfilerActivity.CUDA,
                    ]
                )
                prof.__enter__()
        ctx = model.no_sync() if mode == "ddp+nosync" else torch.autocast("cuda", enabled=False)
        with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        if mode == "ddp+nosync":
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if prof is not None and i == warmup + 10:
            torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            print(
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), file=sys.stderr
            )
            prof = None
    torch.cuda.synchronize()
    rate = (steps - warmup) * batch / (time.perf_counter() - t0)
    if mode.startswith("ddp"):
        buf = torch.randn(45_000_000 // 4, device=device)
        for _ in range(3):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t) * 100
        if local == 0:
            print(json.dumps({"allreduce_45MB_ms": ms}), flush=True)
        dist.destroy_process_group()
    return rate


def main() -> None:
    if (
        len(sys.argv) > 1
        and "LOCAL_RANK" in os.environ
        or sys.argv[1:2] in (["alone"], ["side-by-side"])
    ):
        print(
            json.dumps(
                {
                    "mode": sys.argv[1],
                    "rank": os.environ.get("LOCAL_RANK", "0"),
                    "per_gpu": step_rate(sys.argv[1]),
                }
            ),
            flush=True,
        )
        return
    me = [sys.executable, __file__]
    run = lambda cmd, **kw: subprocess.run(cmd, capture_output=True, text=True, **kw)  # noqa: E731
    print(run([*me, "alone"], env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"}).stdout.strip())
    procs = [
        subprocess.Popen(
            [*me, "side-by-side"],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": str(g)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for g in (0, 1)
    ]
    print("\n".join(p.communicate()[0].strip() for p in procs))
    modes = sys.argv[1:] or ["ddp", "ddp+nosync", "ddp-bucket100", "ddp-static"]
    for mode in os.environ.get("MODES", " ".join(modes)).split():
        out = run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                __file__,
                mode,
            ]
        )
        print(out.stdout.strip())
        if os.environ.get("PROFILE"):
            print(out.stderr[-4000:])


if __name__ == "__main__":
    main()
