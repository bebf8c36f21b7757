"""The device path's crop of one batch: one roi_align per image size (expctl up to stop 43) against
`gpucrop.crop_resize` (two batched matmuls per bucket), on photographs of four sizes and of as
many as ImageNet's (issue 25).

    python bench/crop_bench.py --root /tmp/jpegs25 --root /tmp/jpegs25-imagenet   # on a GPU
    python bench/crop_bench.py --root DIR --reps 3                                 # the code, on the CPU

For each folder: 256 of its training JPEGs decoded once on the GPU, their crop boxes drawn as
the workers draw them; then each crop 30 times on one thread: the CPU time of the call (what the
feeding thread spends launching) and the GPU time (CUDA events), medians; the two outputs'
largest difference; the number of image sizes in the batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from expctl.builtin.datasets.gpucrop import crop_resize, to_device
from expctl.builtin.datasets.imagefiles import crop_box


def per_size(
    images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, size: int
) -> tuple[torch.Tensor, list[int]]:
    """The crop as `gpuimages.finish` did it up to stop 43: one roi_align per group of
    same-sized images, each group's boxes and flips copied to the device."""
    device = images[0].device
    groups: dict[tuple[int, ...], list[int]] = {}
    for j, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(j)
    parts, order = [], []
    for at in groups.values():
        stacked = torch.stack([images[j] for j in at]).float()
        rois = torch.cat([torch.arange(len(at), dtype=torch.float64)[:, None], boxes[at]], 1)
        out = roi_align(
            stacked, to_device(rois.float(), device), (size, size), 1.0, -1, aligned=True
        )
        flip = to_device(flips[at], device)[:, None, None, None]
        parts.append(torch.where(flip, out.flip(-1), out))
        order += at
    return torch.cat(parts), order


def measure(root: Path, device: torch.device, size: int, reps: int) -> dict[str, object]:
    files = sorted((root / "train").rglob("*.jpg"))[:256]
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    drawn = [crop_box(im.shape[-1], im.shape[-2], size, True, "imagenet") for im in images]
    boxes = torch.tensor([b for b, _ in drawn], dtype=torch.float64)
    flips = torch.tensor([f for _, f in drawn])
    row: dict[str, object] = {"folder": root.name, "sizes": len({im.shape for im in images})}
    outs = {}
    for name, fn in (("per size", per_size), ("crop_resize", crop_resize)):
        cpu, gpu = [], []
        cuda = device.type == "cuda"
        for _ in range(reps):
            if cuda:
                torch.cuda.synchronize(device)
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
            t0 = time.perf_counter()
            out, order = fn(images, boxes, flips, size)
            cpu.append((time.perf_counter() - t0) * 1e3)
            if cuda:
                end.record()
                torch.cuda.synchronize(device)
            gpu.append(start.elapsed_time(end) if cuda else cpu[-1])
        outs[name] = out[torch.tensor(sorted(range(len(order)), key=order.__getitem__))]
        row[f"{name} CPU ms"] = round(statistics.median(cpu[2:]), 2)
        row[f"{name} GPU ms"] = round(statistics.median(gpu[2:]), 2)
    row["max diff"] = float((outs["per size"] - outs["crop_resize"]).abs().max())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--root", type=Path, action="append", required=True)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    rows = [measure(r, device, a.size, a.reps) for r in a.root]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
