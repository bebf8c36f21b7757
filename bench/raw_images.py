"""The image-folder baseline: torchvision's ImageFolder + PIL transforms + DataLoader, as the
PyTorch ImageNet example writes it; ResNet-50, bf16 autocast, channels_last, SGD, one GPU.

    python bench/raw_images.py --root /tmp/jpegs/train --steps 100 --warmup 25
prints one JSON line: samples/s over the steps after --warmup.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torchvision
from torchvision import transforms


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))  # = cores
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = torchvision.datasets.ImageFolder(a.root, tf)
    loader = torch.utils.data.DataLoader(
        ds, a.batch, shuffle=True, num_workers=a.workers, pin_memory=True, drop_last=True,
        persistent_workers=True,
    )  # fmt: skip
    model = torchvision.models.resnet50(num_classes=len(ds.classes)).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    step, start = 0, 0.0
    while step < a.steps:
        for x, y in loader:
            x = x.cuda(non_blocking=True).to(memory_format=torch.channels_last)
            y = y.cuda(non_blocking=True)
            with torch.autocast("cuda", torch.bfloat16):
                loss = loss_fn(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == a.warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            if step == a.steps:
                break
    torch.cuda.synchronize()
    rate = (a.steps - a.warmup) * a.batch / (time.perf_counter() - start)
    print(json.dumps({"samples_per_s": rate}))


if __name__ == "__main__":
    main()
