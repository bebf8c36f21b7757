"""The image-folder baseline: torchvision's ImageFolder + PIL transforms + DataLoader, as the
PyTorch ImageNet example writes it; ResNet-50, bf16 autocast, channels_last, SGD; one GPU, or DDP
over several when started by torchrun (a DistributedSampler, the workers shared by the ranks).

    python bench/raw_images.py --root /tmp/jpegs/train --steps 100 --warmup 25
    torchrun --standalone --nproc_per_node=4 bench/raw_images.py --root /tmp/jpegs/train
prints one JSON line (rank 0): samples/s of all ranks over the steps after --warmup.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torchvision
from torchvision import transforms


def main() -> None:
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--workers", type=int, default=max(1, len(os.sched_getaffinity(0)) // ranks))
    p.add_argument("--model", default="resnet50")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the code")
    a = p.parse_args()
    ddp = "WORLD_SIZE" in os.environ
    cuda = a.device == "cuda"
    if ddp:
        dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(a.size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = torchvision.datasets.ImageFolder(a.root, tf)
    sampler = torch.utils.data.DistributedSampler(ds, drop_last=True) if ddp else None
    loader = torch.utils.data.DataLoader(
        ds, a.batch, shuffle=sampler is None, sampler=sampler, num_workers=a.workers,
        pin_memory=cuda, drop_last=True, persistent_workers=True,
    )  # fmt: skip
    model = getattr(torchvision.models, a.model)(num_classes=len(ds.classes)).to(device)
    model = model.to(memory_format=torch.channels_last)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, [local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=cuda)
    loss_fn = torch.nn.CrossEntropyLoss()
    step, start, epoch = 0, 0.0, 0
    while step < a.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            x = x.to(device, non_blocking=True).to(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
                loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == a.warmup:
                torch.cuda.synchronize() if cuda else None
                start = time.perf_counter()
            if step == a.steps:
                break
    torch.cuda.synchronize() if cuda else None
    world = dist.get_world_size() if ddp else 1
    rate = (a.steps - a.warmup) * a.batch * world / (time.perf_counter() - start)
    if not ddp or dist.get_rank() == 0:
        print(json.dumps({"samples_per_s": rate}))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
