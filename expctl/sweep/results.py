"""A sweep's results as data: every trial's parameters, metrics, status and run directory.

`expctl sweep table` prints them as text, JSON (``--json``) or CSV (``--csv``), sorted
(``--sort KEY``, ``--sort=-KEY`` for descending) and filtered (``--filter KEY=VALUE``);
`expctl.sweep_results(SWEEP_DIR)` returns them to Python (``.to_pandas()`` for a DataFrame).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from expctl import tables
from expctl.sweep import aggregate, ledger
from expctl.sweep.aggregate import fmt_float, fmt_int, short
from expctl.sweep.ledger import STATUSES, Row
from expctl.tables import finite

# the columns of every sweep (parameters go after the first two, metrics after the next two)
FIXED = ("trial", "status", "value", "best") + (
    "epoch",
    "step",
    "wall_s",
    "seed",
    "repeat",
    "error",
    "run_dir",
    "overrides",
)


@dataclass
class SweepResults:
    """Every trial of a sweep by number (`ledger.Row`: status, params, value, metrics, run_dir),
    pending ones included, and the metric the sweep ranks them by."""

    sweep_dir: Path
    metric: str
    mode: str  # "max" or "min": which way is better
    rows: list[Row]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the sweep's metric and one object per trial."""
        return {
            "sweep_dir": str(self.sweep_dir),
            "metric": self.metric,
            "mode": self.mode,
            "trials": [_nested(r) for r in self.rows],
        }

    def records(self) -> list[dict[str, Any]]:
        """One flat dict per trial: trial, status, each parameter, value, best, each metric
        (`val/acc`, `test/acc`, ...), epoch, step, wall_s, seed (train.seed), repeat (its index
        among --repeat's seeds), error, run_dir, overrides."""
        out = []
        for r in self.rows:
            nested = _nested(r)
            params, metrics = nested.pop("params"), nested.pop("metrics")
            head = {k: nested.pop(k) for k in ("trial", "status")}
            scores = {k: nested.pop(k) for k in ("value", "best")}
            out.append({**head, **params, **scores, **metrics, **nested})
        return out

    def columns(self) -> list[str]:
        """The keys of `records`, in their order (a pending trial lacks some)."""
        params = dict.fromkeys(k for r in self.rows for k in r.params)
        metrics = dict.fromkeys(k for r in self.rows for k in r.metrics)
        return [*FIXED[:2], *params, *FIXED[2:4], *metrics, *FIXED[4:]]

    def to_pandas(self) -> Any:
        """The records as a pandas DataFrame, one row per trial, indexed by trial number.

        Raises:
            UserError: pandas is not installed.
        """
        return tables.to_pandas(self.records(), "trial", "SweepResults.to_pandas()")

    def select(self, sort: str | None = None, filters: Sequence[str] = ()) -> SweepResults:
        """The trials that pass every filter (`tables.select`: ``KEY=VALUE``, one key given
        several times: any of its values; ``KEY>X`` and the like on numbers), ordered by column
        `sort` (``-KEY``: descending; None: best first).

        Raises:
            UserError: an unknown column or status, or a filter without an operator.
        """
        listing = "expctl sweep table --csv SWEEP_DIR"
        picked = tables.select(
            self.records(), sort, filters, self.columns(), listing, {"status": STATUSES}
        )
        rows = [self.rows[i] for i in picked]
        if sort is None:
            rows.sort(key=lambda r: (aggregate.sort_key(r.value, self.mode), r.number))
        return replace(self, rows=rows)


def load(sweep_dir: str | Path) -> SweepResults:
    """Every trial of the sweep in `sweep_dir` by number, pending ones included: `expctl.sweep_results`.

    Args:
        sweep_dir: the folder `expctl run -m` printed; it may be read while trials run.

    Returns:
        `SweepResults`: iterate its rows (`ledger.Row`: number, status, params, value, metrics,
        run_dir, ...), or take `.records()` (flat dicts) or `.to_pandas()`.

    Raises:
        UserError: not a sweep directory, or its journal is damaged.
    """
    path = Path(sweep_dir)
    s = ledger.settings(path)
    return SweepResults(path, s.metric, s.mode, ledger.rows(path))


def _nested(r: Row) -> dict[str, Any]:
    return {
        "trial": r.number,
        "status": r.status,
        "params": r.params,
        "value": finite(r.value),
        "best": finite(r.best),
        "metrics": {k: finite(v) for k, v in r.metrics.items()},
        "epoch": r.epoch,
        "step": r.step,
        "wall_s": r.wall_s,
        "seed": r.seed,  # its train.seed
        "repeat": r.seed_idx,  # which of --repeat's seeds (0: the base seed's)
        "error": r.error,
        "run_dir": r.run_dir,
        "overrides": r.overrides,
        "lineage": r.lineage,
    }


def to_json(res: SweepResults) -> str:
    """`expctl sweep table --json`."""
    return tables.to_json(res.to_dict())


def to_csv(res: SweepResults) -> str:
    """`expctl sweep table --csv`: the records, one row per trial, a header of their columns."""
    return tables.to_csv(res.records(), res.columns())


def table(sweep_dir: str | Path, sort: str | None = None, filters: Sequence[str] = ()) -> str:
    """One line per trial, best first (`sort`: by a column), pending ones included; with
    repeats, one line per configuration (mean ± std over its completed seeds; `sort` may be
    `mean` or `std` there).

    `epoch` is the epoch a trial ended in, counted from 1 (a trial stopped inside its first
    epoch by train.max_steps shows 1), `steps` its optimizer steps; sampled floats are shown to
    4 significant digits.
    """
    every = load(sweep_dir)
    by_group = aggregate.repeated(every.rows) and (sort or "").lstrip("-") in GROUP_SORTS
    res = every.select(None if by_group else sort, filters)
    counts = ", ".join(f"{n} {s}" for s in STATUSES if (n := sum(r.status == s for r in res.rows)))
    shown = f"{len(res)} of {len(every)}" if filters else f"{len(res)}"
    lines = [
        f"sweep {res.sweep_dir}  ({shown} trial(s): {counts or 'none'}; {res.metric}, {res.mode})"
    ]
    if aggregate.repeated(every.rows):
        lines += _group_lines(res, sort)
    else:
        lines += _trial_lines(res)
    left = [r for r in every.rows if r.status in ("pending", *ledger.UNFINISHED)]
    # a running trial, or a queued one (a Slurm job asked for it): the sweep is still going
    busy = any(
        r.status == "running" or (r.status == "pending" and r.optuna_trial is not None)
        for r in every.rows
    )
    if left and not busy:
        lines.append(
            f"{len(left)} trial(s) not run to the end: `expctl sweep resume {res.sweep_dir}` runs them"
        )
    return "\n".join(lines)


TAIL = f"{'epoch':>6} {'steps':>6} {'wall s':>7}  overrides"


def _trial_lines(res: SweepResults) -> list[str]:
    w = max([9, *(len(r.status) for r in res.rows)])  # `interrupted` shifted its row
    lines = [f"{'trial':>5}  {'status':<{w}} {res.metric:>12} {'best':>8} {TAIL}"]
    for r in res.rows:
        text = (
            f"{r.number:>5}  {r.status:<{w}} {fmt_float(r.value):>12} {fmt_float(r.best):>8} "
            f"{fmt_int(r.epoch):>6} {fmt_int(r.step):>6} {fmt_float(r.wall_s):>7}  "
            f"{short(r.overrides, r.params)}"
        )
        lines.append(text + (f"  | {r.error}" if r.error else ""))
    return lines


GROUP_SORTS = ("mean", "std")  # --sort keys of a repeat table's columns, not of its trials


def _group_lines(res: SweepResults, sort: str | None) -> list[str]:
    """A line per configuration; best mean first, or by the mean or the std as `sort` says
    (`value` or `mean`, `std`; `-KEY`: descending), else in the order of `sort`'s trials; a
    mean (std) no two seeds completed, last."""
    groups = aggregate.groups(res.rows)
    key = "value" if sort is None else sort.lstrip("-")
    if key in ("value", *GROUP_SORTS):
        mode = res.mode if sort is None else ("max" if sort.startswith("-") else "min")
        of = aggregate.std if key == "std" else aggregate.mean
        groups.sort(key=lambda g: aggregate.sort_key(of(g), mode))
    statuses = ["/".join(sorted({r.status for r in g})) for g in groups]
    w = max([9, *map(len, statuses)])
    lines = [f"{'runs':>5}  {'status':<{w}} {'mean':>12} {'± std':>8} {TAIL}"]
    for g, status in zip(groups, statuses, strict=True):
        lines.append(
            f"{len(g):>5}  {status:<{w}} {fmt_float(aggregate.mean(g)):>12} "
            f"{fmt_float(aggregate.std(g)):>8} {fmt_int(aggregate.most(r.epoch for r in g)):>6} "
            f"{fmt_int(aggregate.most(r.step for r in g)):>6} "
            f"{fmt_float(sum(r.wall_s or 0 for r in g)):>7}  "
            f"{short(aggregate.config_label(g[0]), g[0].params)}"
        )
    return lines
