"""What seeding torch's RNG per sample costs a DataLoader worker (issue 25, reader.py's _Keyed).

    python bench/sample_seed.py

torch.manual_seed also seeds every CUDA device; in a process where CUDA is not initialised (a
worker) that call is queued with its stack formatted, for every sample. The CPU generator alone
draws the same numbers. Prints microseconds per sample for both, alternated.
"""

from __future__ import annotations

import time

import torch


def everything(seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.rand(())


def cpu_only(seed: int) -> torch.Tensor:
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return torch.rand(())


def main(n: int = 20000) -> None:
    for f in (everything, cpu_only, everything, cpu_only):
        start = time.perf_counter()
        for i in range(n):
            f(i)
        print(f"{f.__name__:10s} {(time.perf_counter() - start) / n * 1e6:6.1f} us/sample")
    same = all(torch.equal(everything(i), cpu_only(i)) for i in range(100))
    print("same draws:", same)


if __name__ == "__main__":
    main()
