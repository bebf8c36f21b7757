"""What starting a rank's DataLoader workers costs, by start method (issue 28, DESIGN.md trap 13).

A rank that forks while another of its threads runs can hang the child, so expctl forks its
workers once, before any thread exists (`expctl/builtin/reader.py`). The alternatives start workers that
do not inherit the forking process's threads: `forkserver` (a server interpreter forks them) and
`spawn` (a fresh interpreter each). Measured here in a process that imported torch and expctl
(what a rank holds), on samples made in `__getitem__`:

- start: from the iterator's creation to the first batch, with `--workers` persistent workers;
  forkserver once cold (its server starts: the first DataLoader of the process) and once warm,
  with Python's default preload (`__main__`) and with torch preloaded in the server;
- pass: a later pass of the same workers (what a validation costs expctl now), against
  `fresh` (a new fork-started DataLoader per pass: what each validation cost before).

    .venv/bin/python bench/worker_start.py --workers 2 --repeats 5 [--json bench/results/X.json]

Each figure is the median (min..max) of `--repeats` runs, each in a new process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class Made(Dataset[Any]):
    """Samples made in `__getitem__` (a seeded input and a label), as a user's map-style set."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, 32, 32, generator=g)
        return x, int(x.sum() > 0)


def _loader(method: str, workers: int) -> DataLoader[Any]:
    context: Any = {"fresh": "fork", "forkserver+torch": "forkserver"}.get(method, method)
    if method == "forkserver+torch":  # its server imports torch once, for every worker
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", "torch.utils.data"])
    return DataLoader(
        Made(), batch_size=64, num_workers=workers, persistent_workers=method != "fresh",
        multiprocessing_context=context,
    )  # fmt: skip


def _first_batch(loader: DataLoader[Any]) -> float:
    t = time.perf_counter()
    next(iter(loader))
    return time.perf_counter() - t


def one(method: str, workers: int) -> dict[str, float]:
    """In this process: start and pass times of `method` (seconds)."""
    import expctl.rank.train  # noqa: F401  (what a rank has imported before its workers start)

    loader = _loader(method, workers)
    out = {"start": _first_batch(loader), "pass": _first_batch(loader)}
    if method.startswith("forkserver"):  # the server runs now: a second DataLoader's workers
        out["start_warm"] = _first_batch(_loader(method, workers))
    if method == "fork":  # before: a new DataLoader (fresh workers) for each validation
        fresh = _loader("fresh", workers)
        _first_batch(fresh)
        out["fresh_pass"] = _first_batch(fresh)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.workers)))
        return
    methods = ("fork", "forkserver", "forkserver+torch", "spawn")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for _ in range(a.repeats):  # interleaved: the machine's load drifts alike for all
        for method, rows in runs.items():
            cmd = [sys.executable, __file__, "--one", method, "--workers", str(a.workers)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.splitlines()[-1]))
    table = {}
    for method, rows in runs.items():
        for key in rows[0]:
            values = [r[key] for r in rows]
            table[f"{method} {key}"] = {
                "median_s": round(statistics.median(values), 4),
                "min_s": round(min(values), 4),
                "max_s": round(max(values), 4),
            }
            cell = table[f"{method} {key}"]
            print(
                f"{method:>16} {key:<11} {cell['median_s']:8.3f} s  "
                f"({cell['min_s']:.3f}..{cell['max_s']:.3f})"
            )
    if a.json:
        meta = {"workers": a.workers, "repeats": a.repeats, "torch": torch.__version__}
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "table": table}, f, indent=1)


if __name__ == "__main__":
    main()
