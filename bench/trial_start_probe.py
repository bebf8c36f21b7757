"""Where a packed trial's start-up goes (issue 24): N processes forked at once from a parent that
imported torch (as the sweep's zygote forks its trials), each on GPU i % G (CUDA_VISIBLE_DEVICES
set in the child before CUDA starts, as a trial's share does), timing each phase in the child:

    fork       the parent's os.fork() call for this child (the zygote forks one after another)
    to child   the fork's start -> the child's first line
    cuda       the child's first CUDA call (its context)
    model      ResNet-18 built and moved to its GPU
    step       the first forward and backward of a batch of 256 x 3x32x32 (cuDNN picks kernels)

    python bench/trial_start_probe.py --procs 1,4,16     (on a GPU machine; prints one table)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torchvision


def child(i: int, gpus: int, t_fork: float, w: int) -> None:
    t0 = time.perf_counter()
    os.environ["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 16))
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    model = torchvision.models.resnet18(num_classes=10).cuda()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    torch.backends.cudnn.benchmark = True
    x = torch.randn(256, 3, 32, 32, device="cuda")
    model(x).sum().backward()
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    row = {"to_child": t0 - t_fork, "cuda": t1 - t0, "model": t2 - t1, "step": t3 - t2}
    os.write(w, (json.dumps(row) + "\n").encode())
    os._exit(0)


def wave(n: int, gpus: int) -> dict[str, float]:
    r, w = os.pipe()
    forks, pids = [], []
    for i in range(n):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(i, gpus, t, w)
        forks.append(time.perf_counter() - t)
        pids.append(pid)
    os.close(w)
    for pid in pids:
        os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        rows = [json.loads(line) for line in f]
    out = {"fork": statistics.median(forks)}
    for key in ("to_child", "cuda", "model", "step"):
        out[key] = statistics.median(r[key] for r in rows)
        out[key + "_max"] = max(r[key] for r in rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--procs", default="1,4,16")
    a = p.parse_args()
    # counted without starting CUDA in this process (its children could not use it after a fork)
    gpus = (
        len(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.split("\n"))
        - 1
    )
    print(f"{gpus} GPUs; medians (max) in seconds")
    print(f"{'procs':>5} {'fork':>6} {'to child':>13} {'cuda':>13} {'model':>13} {'step':>13}")
    for n in map(int, a.procs.split(",")):
        o = wave(n, gpus)
        cells = " ".join(
            f"{o[k]:>6.2f} ({o[k + '_max']:>4.2f})" for k in ("to_child", "cuda", "model", "step")
        )
        print(f"{n:>5} {o['fork']:>6.3f} {cells}")


if __name__ == "__main__":
    main()
