"""The baseline: a plain PyTorch DDP training loop, as a competent engineer writes it.

torchrun (or one process), DistributedSampler, autocast, channels_last and fused Adam/SGD when
asked, torch.compile when asked, no framework. `--loader tensor` indexes whole tensors (on the
GPU when there is one: expctl's in-memory data path); `--loader dataloader` is the DataLoader most
scripts use. The model and data builders are expctl's, so the three contenders train
the very same network on the very same tensors; nothing else of expctl runs here.

    torchrun --nproc_per_node=2 bench/raw_ddp.py --model cnn --data synthetic --batch 256
prints one JSON line: samples/s and ms/step over the steps after --warmup.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    import torch

    from expctl.builtin.datasets.idx import fashion_mnist
    from expctl.builtin.datasets.synthetic import synthetic

    if args.data == "fashion":
        splits = fashion_mnist(root=args.root)
    else:
        shape = tuple(int(s) for s in args.shape.split("x"))
        splits = synthetic(shape=shape, num_samples=args.samples, val_samples=0)
    torch.manual_seed(0)
    model = make_model(args.model, splits.info.input_shape, splits.info.num_classes or 10)
    return model, splits.train  # type: ignore[return-value]


def make_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The network by expctl's name for it, built by the same builder expctl uses."""
    from expctl.builtin import models

    if name == "mlp":
        return models.mlp(input_shape=input_shape, num_classes=num_classes)
    if name == "cnn":
        return models.cnn(in_channels=input_shape[0], num_classes=num_classes)
    if name == "resnet18_cifar":
        from bench_models import resnet18_cifar

        return resnet18_cifar(in_channels=input_shape[0], num_classes=num_classes)
    from torchvision.models import get_model

    return get_model(name, weights=None, num_classes=num_classes)


def common_args() -> argparse.ArgumentParser:
    """The workload flags every contender takes (the harness passes the same to each)."""
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--data", default="synthetic", choices=("synthetic", "fashion"))
    p.add_argument("--root", default=None)
    p.add_argument("--shape", default="1x28x28")
    p.add_argument("--samples", type=int, default=16384)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--precision", default="32", choices=("32", "bf16"))
    p.add_argument("--optim", default="sgd", choices=("sgd", "adamw"))
    return p


def _print_profile(prof: torch.profiler.profile) -> None:
    prof.__exit__(None, None, None)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    print(table, file=sys.stderr, flush=True)


def main() -> None:
    p = common_args()
    p.add_argument("--channels-last", action="store_true")
    p.add_argument(
        "--loader", default="dataloader", choices=("dataloader", "tensor", "static"),
        help="static: one batch, made once and reused (no per-step data work: the ceiling)",
    )  # fmt: skip
    p.add_argument(
        "--profile", type=int, default=0,
        help="print a profile of the first N timed steps (rank 0; the JSON's rate then includes "
        "the profiler's cost: a diagnostic run, not a measurement)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--compile", default=None, help="torch.compile mode (default, reduce-overhead)")
    args = p.parse_args()

    distributed = "RANK" in os.environ
    rank, world = (
        (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if distributed else (0, 1)
    )
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup {args.warmup} must be >= 0 and below --steps {args.steps}")
    if not 0 <= args.profile <= args.steps - args.warmup:
        p.error(f"--profile {args.profile}: at most the {args.steps - args.warmup} timed steps")
    if args.batch < 1 or args.batch > args.samples // world:
        p.error(f"--batch {args.batch}: 1 to the {args.samples // world} samples each rank has")
    # after the arguments are checked: a refusal needs no torch (~4 s of imports)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif distributed:
        torch.set_num_threads(
            max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        )
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")

    model, dataset = build(args)
    model.to(device)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    model.to(memory_format=fmt)  # type: ignore[call-overload]
    if distributed:
        model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True)
    if args.compile:
        model = torch.compile(model, mode=args.compile)  # type: ignore[assignment]
    fused = {"fused": True} if cuda else {}
    if args.optim == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=0.05, momentum=0.9, **fused
        )
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **fused)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=0, drop_last=True
    )

    if args.loader in ("tensor", "static"):  # the in-memory path: whole tensors on the device
        x_all, y_all = (t.to(device) for t in dataset.tensors)
    if args.loader == "static":
        one = x_all[: args.batch].contiguous(memory_format=fmt), y_all[: args.batch]

    def batches(epoch: int):  # type: ignore[no-untyped-def]
        sampler.set_epoch(epoch)
        if args.loader == "static":
            yield from (one for _ in range(len(sampler) // args.batch))
            return
        if args.loader == "tensor":  # index whole tensors, as expctl does
            # pinned + non_blocking, as expctl: a pageable copy would wait for the queued steps
            idx = torch.tensor(list(sampler))
            idx = (idx.pin_memory() if cuda else idx).to(device, non_blocking=True)
            for i in range(0, len(idx) - args.batch + 1, args.batch):
                sel = idx[i : i + args.batch]
                yield x_all[sel], y_all[sel]
            return
        loader = DataLoader(
            dataset,
            batch_size=args.batch,
            sampler=sampler,
            drop_last=True,
            num_workers=args.workers,
            pin_memory=cuda,
            persistent_workers=args.workers > 0,
        )
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    step, epoch, t0 = 0, 0, 0.0
    model.train()
    t_ready = time.time()  # wall clock: the harness compares it with the launch time
    prof = None
    while step < args.steps:
        for x, y in batches(epoch):
            if step == args.warmup:
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            if args.profile and rank == 0 and step == args.warmup:
                prof = torch.profiler.profile()
                prof.__enter__()
            if prof is not None and step == args.warmup + args.profile:
                prof = _print_profile(prof)
            x = x.contiguous(memory_format=fmt) if x.dim() == 4 else x
            with amp:
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == args.steps:
                break
        epoch += 1
    if prof is not None:  # --profile covered every timed step
        prof = _print_profile(prof)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    t_done = time.time()
    timed = args.steps - args.warmup
    if rank == 0:
        print(
            json.dumps(
                {
                    "samples_per_s": timed * args.batch * world / elapsed,
                    "ms_per_step": 1000 * elapsed / timed,
                    "loss": float(loss.detach()),
                    "profiled_steps": args.profile,
                    "t_ready": t_ready,
                    "t_done": t_done,
                }
            ),
            flush=True,
        )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
