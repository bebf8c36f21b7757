"""torchvision's CUDA decode_jpeg of 256 JPEGs, by the images' sizes (issue 25, stop 44): which
images make the batched call slow. `python bench/decode_sizes.py DIR [DIR ...]` (on a GPU)."""

import sys
import time
from pathlib import Path

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg


def rate(data: list[torch.Tensor]) -> float:
    if not data:
        return float("nan")
    for i in range(4):
        if i == 1:
            torch.cuda.synchronize()
            t = time.perf_counter()
        decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda")
    torch.cuda.synchronize()
    return 3 * len(data) / (time.perf_counter() - t)


for root in sys.argv[1:]:
    files = sorted(Path(root, "train").rglob("*.jpg"))[:512]
    data = [torch.frombuffer(bytearray(f.read_bytes()), dtype=torch.uint8) for f in files]
    sizes = [Image.open(f).size for f in files]
    groups = {
        "all": range(len(files)),
        "both sides <= 500": [i for i, (w, h) in enumerate(sizes) if w <= 500 and h <= 500],
        "a side > 500": [i for i, (w, h) in enumerate(sizes) if w > 500 or h > 500],
        "even sides": [i for i, (w, h) in enumerate(sizes) if w % 2 == 0 and h % 2 == 0],
        "an odd side": [i for i, (w, h) in enumerate(sizes) if w % 2 or h % 2],
        "500x375 only": [i for i, s in enumerate(sizes) if s == (500, 375)],
    }
    for name, idx in groups.items():
        sub = [data[i] for i in idx][:256]
        print(f"{Path(root).name:20} {name:18} n={len(sub):3}  {rate(sub):8,.0f} img/s", flush=True)
