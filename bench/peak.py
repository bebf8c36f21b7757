"""The GPU's achievable bf16 matrix-multiply rate, measured now: the denominator of model FLOPs
utilisation (MFU). Square 8192 matmuls, 20 warm-up, 100 timed; prints one JSON line.

    python bench/peak.py
"""

from __future__ import annotations

import json
import time

import torch


def main(n: int = 8192, warmup: int = 20, iters: int = 100) -> None:
    if not torch.cuda.is_available():
        raise SystemExit("peak.py: no CUDA GPU here (it measures a GPU's bf16 matmul rate)")
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    tflops = 2 * n**3 * iters / (time.perf_counter() - t) / 1e12
    print(json.dumps({"bf16_matmul_tflops": tflops, "gpu": torch.cuda.get_device_name(0)}))


if __name__ == "__main__":
    main()
