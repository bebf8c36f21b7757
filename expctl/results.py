"""A sweep's results as data: every trial's parameters, metrics, status and run directory.

`expctl sweep table` prints them as text, JSON (``--json``) or CSV (``--csv``), sorted
(``--sort KEY``, ``--sort=-KEY`` for descending) and filtered (``--filter KEY=VALUE``);
`expctl.sweep_results(SWEEP_DIR)` returns them to Python (``.to_pandas()`` for a DataFrame).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from expctl import ledger
from expctl.errors import UserError, choices_text, did_you_mean, unknown_name
from expctl.ledger import STATUSES, Row, fmt_float, fmt_int, short

# the columns of every sweep (parameters go after the first two, metrics after the next two)
FIXED = ("trial", "status", "value", "best") + (
    "epoch",
    "step",
    "wall_s",
    "seed",
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
        (`val/acc`, `test/acc`, ...), epoch, step, wall_s, seed, error, run_dir, overrides."""
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
        try:
            import pandas  # lazy: optional, and heavy
        except ImportError:
            raise UserError(
                "SweepResults.to_pandas() needs pandas, which is not installed",
                "pip install pandas (or use .records(): a list of dicts)",
            ) from None
        return pandas.DataFrame.from_records(self.records()).set_index("trial")

    def select(self, sort: str | None = None, filters: Sequence[str] = ()) -> SweepResults:
        """The trials that pass every ``KEY=VALUE`` filter (one key given several times: any of
        its values), ordered by column `sort` (``-KEY``: descending; None: best first).

        Raises:
            UserError: an unknown column or status, or a filter without ``=``.
        """
        columns = self.columns()
        wanted: dict[str, list[str]] = {}
        for text in filters:
            key, sep, value = text.partition("=")
            if not sep:
                raise UserError(
                    f"--filter {text!r}: expected KEY=VALUE", "e.g. --filter status=failed"
                )
            _check_column(key, columns, "--filter")
            if key == "status" and value not in STATUSES:
                raise unknown_name(
                    "status", value, STATUSES, "e.g. --filter status=failed --filter status=lost"
                )
            wanted.setdefault(key, []).append(value)
        keep = [
            (r, rec)
            for r, rec in zip(self.rows, self.records(), strict=True)
            if all(any(_matches(rec.get(k), v) for v in vs) for k, vs in wanted.items())
        ]
        if sort is None:
            keep.sort(key=lambda x: (ledger.sort_key(x[0].value, self.mode), x[0].number))
        else:
            key = sort.removeprefix("-")
            _check_column(key, columns, "--sort")
            present = [x for x in keep if x[1].get(key) is not None]
            present.sort(key=lambda x: _order(x[1][key]), reverse=sort.startswith("-"))
            keep = present + [x for x in keep if x[1].get(key) is None]
        return replace(self, rows=[r for r, _ in keep])


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
        "value": _finite(r.value),
        "best": _finite(r.best),
        "metrics": {k: _finite(v) for k, v in r.metrics.items()},
        "epoch": r.epoch,
        "step": r.step,
        "wall_s": r.wall_s,
        "seed": r.seed_idx,
        "error": r.error,
        "run_dir": r.run_dir,
        "overrides": r.overrides,
    }


def _finite(v: float | None) -> float | None:
    """NaN and infinity as None: JSON has no spelling for them (a diverged trial's loss)."""
    return v if v is None or math.isfinite(v) else None


def _check_column(key: str, columns: list[str], option: str) -> None:
    if key not in columns:
        raise UserError(
            f"{option} {key}: no such column.{did_you_mean(key, columns)} Valid: "
            f"{choices_text(columns, limit=20)}",
            "the columns are those of `expctl sweep table --csv SWEEP_DIR`",
        )


def _cell(v: Any) -> Any:
    """A value as one CSV cell or filter text: lists and mappings in JSON (`[32,32]`)."""
    return json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else v


def _matches(value: Any, text: str) -> bool:
    if value is None:
        return text in ("", "null", "None", "-")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(_cell(value)).lower() == text.lower()


def _order(v: Any) -> tuple[int, Any]:
    """Numbers before text; each in its own order (a column mixes them rarely)."""
    if isinstance(v, (int, float)):
        return (0, float(v))
    return (1, str(_cell(v)))


def to_json(res: SweepResults) -> str:
    """`expctl sweep table --json`."""
    return json.dumps(res.to_dict(), indent=2, allow_nan=False)


def to_csv(res: SweepResults) -> str:
    """`expctl sweep table --csv`: the records, one row per trial, a header of their columns."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=res.columns(), lineterminator="\n")
    writer.writeheader()
    for rec in res.records():
        writer.writerow({k: "" if v is None else _cell(v) for k, v in rec.items()})
    return out.getvalue()


def table(sweep_dir: str | Path, sort: str | None = None, filters: Sequence[str] = ()) -> str:
    """One line per trial, best first (`sort`: by a column), pending ones included; with
    repeats, one line per configuration (mean ± std over its completed seeds).

    `epochs` counts whole epochs and `steps` optimizer steps, so a trial that ended inside an
    epoch (train.max_steps) shows its progress; sampled floats are shown to 4 significant digits.
    """
    every = load(sweep_dir)
    res = every.select(sort, filters)
    counts = ", ".join(f"{n} {s}" for s in STATUSES if (n := sum(r.status == s for r in res.rows)))
    shown = f"{len(res)} of {len(every)}" if filters else f"{len(res)}"
    lines = [
        f"sweep {res.sweep_dir}  ({shown} trial(s): {counts or 'none'}; {res.metric}, {res.mode})"
    ]
    if ledger.repeated(every.rows):
        lines += _group_lines(res, by_mean=sort is None)
    else:
        lines += _trial_lines(res)
    left = [r for r in every.rows if r.status in ("pending", "failed", "lost")]
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


TAIL = f"{'epochs':>6} {'steps':>6} {'wall s':>7}  overrides"


def _trial_lines(res: SweepResults) -> list[str]:
    lines = [f"{'trial':>5}  {'status':<9} {res.metric:>12} {'best':>8} {TAIL}"]
    for r in res.rows:
        text = (
            f"{r.number:>5}  {r.status:<9} {fmt_float(r.value):>12} {fmt_float(r.best):>8} "
            f"{fmt_int(r.epoch):>6} {fmt_int(r.step):>6} {fmt_float(r.wall_s):>7}  "
            f"{short(r.overrides, r.params)}"
        )
        lines.append(text + (f"  | {r.error}" if r.error else ""))
    return lines


def _group_lines(res: SweepResults, by_mean: bool) -> list[str]:
    lines = [f"{'runs':>5}  {'status':<9} {'mean':>12} {'± std':>8} {TAIL}"]
    groups = ledger.groups(res.rows)
    if by_mean:
        groups.sort(key=lambda g: ledger.sort_key(ledger.mean(g), res.mode))
    for g in groups:
        status = "/".join(sorted({r.status for r in g}))
        lines.append(
            f"{len(g):>5}  {status:<9} {fmt_float(ledger.mean(g)):>12} "
            f"{fmt_float(ledger.std(g)):>8} {fmt_int(ledger.most(r.epoch for r in g)):>6} "
            f"{fmt_int(ledger.most(r.step for r in g)):>6} "
            f"{fmt_float(sum(r.wall_s or 0 for r in g)):>7}  "
            f"{short(ledger.config_label(g[0]), g[0].params)}"
        )
    return lines
