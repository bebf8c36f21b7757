"""A sweep's rows summed up: its trials grouped by point of the sweep (the seeds `--repeat` gave
one), each configuration's label, mean and spread over its completed seeds (`sweep table`, `sweep
best`), and the order and number formats the table shows them in.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from expctl.sweep.ledger import Row


def groups(rs: list[Row]) -> list[list[Row]]:
    """Trials by point of the sweep: the seeds `--repeat` gave one (trials N..N+repeat-1, seed
    indices 0..repeat-1), in the order of `rs`. A point written twice (`optim.lr=0.1,0.1`), or
    drawn twice by a sampler, is two groups: its trials are the same run again, not seeds."""
    by_point: dict[int, list[Row]] = {}
    for r in rs:
        by_point.setdefault(r.number - r.seed_idx, []).append(r)
    return list(by_point.values())


def repeated(rs: list[Row]) -> bool:
    """Whether the sweep trains its points with several seeds (`--repeat`)."""
    return any(r.seed_idx for r in rs)


def config_label(r: Row) -> str:
    """The trial's overrides without its seed: the configuration's."""
    text = r.overrides.rsplit("seed#", 1)[0] if r.seed_idx else r.overrides
    return text.strip() or "(base)"


def done(g: list[Row]) -> list[Row]:
    return [r for r in g if r.status == "completed" and r.value is not None]


def mean(g: list[Row]) -> float | None:
    vals = [r.value for r in done(g) if r.value is not None]
    return statistics.fmean(vals) if vals else None


def std(g: list[Row]) -> float | None:
    """The spread of a configuration's completed seeds (None: fewer than two completed)."""
    vals = [r.value for r in done(g) if r.value is not None]
    return statistics.stdev(vals) if len(vals) > 1 else None


def sort_key(value: float | None, mode: str) -> float:
    """Sort key, best first: missing or non-finite values last."""
    if value is None or not math.isfinite(value):
        return math.inf
    return -value if mode == "max" else value


def most(values: Iterable[int | None]) -> int | None:
    return max((v for v in values if v is not None), default=None)


def short(text: str, params: dict[str, Any]) -> str:
    """`text` with sampled floats to 4 significant digits (for display: the ledger and best.yml
    keep them exact)."""
    for k, v in params.items():
        if isinstance(v, float):
            text = text.replace(f"{k}={v}", f"{k}={v:.4g}")
    return text


def fmt_float(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def fmt_int(v: int | None) -> str:
    return "-" if v is None else str(v)
