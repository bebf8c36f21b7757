"""The fashion_speedrun recipe as a plain PyTorch script: same network (expctl's speednet), data
on the GPU, batch 1024, bf16, channels_last, crop+flip augmentation, SGD-Nesterov, warm-up +
cosine, label smoothing, 10 epochs, one evaluation at the end. Prints one JSON line with the
training seconds (loop + final evaluation, as expctl's time/train_s) and the test accuracy.

    python bench/raw_speedrun.py --root /usr/share/datasets/fashion-mnist
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch


def main() -> None:
    from expctl.builtin.data import augment
    from expctl.builtin.datasets.idx import fashion_mnist
    from expctl.builtin.models import speednet

    p = argparse.ArgumentParser()
    p.add_argument("--root", default=None)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.4)
    p.add_argument("--warmup", type=int, default=60)
    args = p.parse_args()

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    splits = fashion_mnist(root=args.root)
    x, y = (t.to(device) for t in splits.train.tensors)  # type: ignore[attr-defined]
    tx, ty = (t.to(device) for t in splits.val.tensors)  # type: ignore[union-attr]
    torch.manual_seed(0)
    model = speednet().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4, fused=True
    )
    steps_per_epoch = len(x) // args.batch
    total = steps_per_epoch * args.epochs

    def factor(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.5 * (
            1 + math.cos(math.pi * min(1.0, (step - args.warmup) / max(1, total - args.warmup)))
        )

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(len(x), device=device)
        for i in range(steps_per_epoch):
            idx = perm[i * args.batch : (i + 1) * args.batch]
            xb = augment(x[idx], "crop_flip").contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(xb), y[idx])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, len(tx), 1024):
            xb = tx[i : i + 1024].contiguous(memory_format=torch.channels_last)
            correct += int((model(xb).argmax(1) == ty[i : i + 1024]).sum())
    torch.cuda.synchronize()
    print(
        json.dumps({"train_s": time.perf_counter() - t0, "test_acc": correct / len(tx)}), flush=True
    )


if __name__ == "__main__":
    main()
