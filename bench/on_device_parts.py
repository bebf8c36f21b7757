"""Where `DeviceDecoded.on_device` spends a batch of 256 (issue 25, stop 44): the decode (of the
batch's views into one tensor, as the workers send it, and of separate tensors), the crop, the
whole call; per folder. `python bench/on_device_parts.py DIR [DIR ...]` (on a GPU)."""

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from expctl.builtin.datasets.gpucrop import crop_resize
from expctl.builtin.datasets.gpuimages import DeviceDecoded, decode
from expctl.builtin.datasets.images import image_folder


def ms(fn: Callable[[], Any]) -> float:
    for i in range(5):
        if i == 2:
            torch.cuda.synchronize()
            t = time.perf_counter()
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / 3 * 1e3


def parts(root: str, cuda: torch.device) -> None:
    t = image_folder(root=root, image_size=224, val=None).train
    dev = DeviceDecoded(t.samples[:256], 224, 3, True, "imagenet", t.normalize, "gpu")  # type: ignore[attr-defined]
    batch = dev.collate([dev[i] for i in range(len(dev))])
    views = batch.encoded
    apart = [v.clone() for v in views]
    images = decode(views, cuda, "gpu", 3)
    decoded = [im for im in images if im is not None]
    at = batch.encoded_at
    print(root, f"{len(views)} JPEGs, {len({im.shape for im in decoded})} sizes", flush=True)
    for name, fn in (
        ("decode (views of one tensor)", lambda: decode(views, cuda, "gpu", 3)),
        ("decode (separate tensors)", lambda: decode(apart, cuda, "gpu", 3)),
        ("crop_resize", lambda: crop_resize(decoded, batch.boxes[at], batch.flips[at], 224)),
        ("on_device", lambda: dev.on_device(batch, cuda)),
    ):
        print(f"  {name:30} {ms(fn):7.1f} ms a batch", flush=True)


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        parts(folder, torch.device("cuda", 0))
