"""Runs side by side: `expctl runs [ROOT ...]`, one table of every run directory under the roots
(sweep trials included) with the config keys that differ between them, and `expctl diff A B`.

Both read files only (config.yaml, result.json, metrics.jsonl, jobs.jsonl, the lock): no torch,
Hydra composition or Optuna. A damaged file is a warning and an empty value, never an error.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from expctl import tables
from expctl.cache import keep, kept_path, read_kept
from expctl.config.frozen import flatten
from expctl.config.schema import RunConfig
from expctl.config.yamlfile import read_yaml
from expctl.errors import UserError
from expctl.inspect.status import STATES, not_a_run_hint, state
from expctl.layout import RunDir, metric_values

log = logging.getLogger("expctl")

BEST = "best:"  # `best:val/acc`: the best value of a monitored metric over the validations
LISTING = "expctl runs --csv ROOT"
UNSET = "(unset)"  # a config key one run has and another lacks
# config keys that name a run's place, not its setting: they differ between any two runs
PLACE = ("run.dir",)


@dataclass
class Run:
    """One run directory, from its files."""

    name: str  # its path under the root it was found in
    path: Path
    status: str  # one of status.STATES
    config: dict[str, Any]  # config.yaml as dotted keys (unresolved), without run.dir
    metrics: dict[str, float]  # final: result.json's, else the last logged value of each
    best: dict[str, float]  # each monitored metric's best validation value, by the config's mode
    wall_s: float | None  # training time (result.json), else from the start to the last row
    started: str | None  # when config.yaml was written (local time, ISO 8601)

    def record(self, config: Sequence[str] | None = None) -> dict[str, Any]:
        """A flat dict: run, status, config keys (`config`: only those), final metrics,
        `best:METRIC`, wall_s, started, path."""
        keys = self.config if config is None else config
        return {
            "run": self.name,
            "status": self.status,
            **{k: self.config.get(k) for k in keys},
            **{k: tables.finite(v) for k, v in self.metrics.items()},
            **{BEST + k: tables.finite(v) for k, v in self.best.items()},
            "wall_s": self.wall_s,
            "started": self.started,
            "path": str(self.path),
        }


@dataclass
class Runs:
    """The runs found under some roots: iterate its rows (`Run`), or take `.records()` (flat
    dicts, the config keys that differ only) or `.to_pandas()`."""

    roots: list[Path]
    rows: list[Run]

    def __iter__(self) -> Iterator[Run]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def differing(self) -> list[str]:
        """The config keys whose values are not the same in every run (set in some, not all,
        included; a run whose config.yaml could not be read is left out)."""
        read = [r.config for r in self.rows if r.config]
        keys = dict.fromkeys(k for c in read for k in c)
        return [k for k in keys if len({repr(c.get(k, UNSET)) for c in read}) > 1]

    def same(self) -> dict[str, Any]:
        """The config keys every run holds with one value."""
        read = [r.config for r in self.rows if r.config]
        differ = set(self.differing())
        return {k: v for k, v in (read[0] if read else {}).items() if k not in differ}

    def ranked(self) -> tuple[list[str], list[str]]:
        """The differing config keys in two groups: those whose value differs between the runs
        that set them (a component's choice, `optim.name`, first; `run.*` last), and the rest:
        keys that split the runs as one of the first group does, and those that differ only in
        being set (the arguments of a component that some runs chose: Adam's betas)."""
        read = [r.config for r in self.rows if r.config]
        vary: list[str] = []
        only_set: list[str] = []
        for k in self.differing():
            values = {repr(c[k]) for c in read if k in c}
            (vary if len(values) > 1 else only_set).append(k)
        # a component's choice first, the run's own bookkeeping (run.name, run.dir) last
        vary.sort(key=lambda k: (k.startswith("run."), not k.endswith(".name")))
        # a key that splits the runs exactly as one before it does says nothing more (data.name
        # beside model.name, the default run.name model-data): after the keys that do
        seen: set[tuple[int, ...]] = set()
        telling: list[str] = []
        echoes: list[str] = []
        for k in vary:
            ids: dict[str, int] = {}
            split = tuple(ids.setdefault(repr(c.get(k, UNSET)), len(ids)) for c in read)
            (echoes if split in seen else telling).append(k)
            seen.add(split)
        return telling, echoes + only_set

    def records(self, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One flat dict per run (`Run.record`) with the config keys that differ, or with
        `columns` only (any config key among them: see `pick`)."""
        if columns is not None:
            return [{k: rec.get(k) for k in columns} for rec in (r.record() for r in self.rows)]
        differ = self.differing()
        return [r.record(differ) for r in self.rows]

    def columns(self) -> list[str]:
        """The keys of `records`, in the table's order: the metrics, then the config keys that
        matter (`ranked`), wall time and start, the other differing keys."""
        metrics = dict.fromkeys(k for r in self.rows for k in r.metrics)
        best = dict.fromkeys(BEST + k for r in self.rows for k in r.best)
        vary, only_set = self.ranked()
        return ["run", "status", *metrics, *best, *vary, "wall_s", "started", *only_set, "path"]

    def pick(self, patterns: Sequence[str]) -> list[str]:
        """The columns `patterns` name (`--columns`: names or globs such as `optim.*`, `val/*`;
        any config key, differing or not), in the order given, `run` first.

        Raises:
            UserError: a pattern that names no column (with a did-you-mean).
        """
        shown = self.columns()
        every = [*shown, *(k for r in self.rows for k in r.config if k not in shown)]
        picked = tables.pick(list(dict.fromkeys(every)), patterns, "--columns", LISTING)
        return ["run", *(c for c in picked if c != "run")]

    def to_dict(self, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """The JSON form: the roots, the config every run shares, one object per run (with
        `columns` only, when given)."""
        return {
            "roots": [str(p) for p in self.roots],
            "same": self.same(),
            "runs": self.records(columns),
        }

    def to_pandas(self) -> Any:
        """The records as a pandas DataFrame, indexed by run name.

        Raises:
            UserError: pandas is not installed.
        """
        return tables.to_pandas(self.records(), "run", "Runs.to_pandas()")

    def select(self, sort: str | None = None, filters: Sequence[str] = ()) -> Runs:
        """The runs that pass every filter on any column, config key or metric (see
        `tables.select`), ordered by `sort` (``-KEY``: descending; None: by start time).

        Raises:
            UserError: an unknown column or status, or a filter without an operator.
        """
        every = [r.record() for r in self.rows]
        columns = list(dict.fromkeys(k for rec in every for k in rec))
        picked = tables.select(every, sort, filters, columns, LISTING, {"status": STATES})
        return replace(self, rows=[self.rows[i] for i in picked])


def load(roots: Sequence[str | Path] = (RunConfig.root,)) -> Runs:
    """Every run directory under `roots` (a root may be one itself), sweep trials included, by
    start time: `expctl.runs`.

    Raises:
        UserError: a root is not a folder, or no run directory lies under them.
    """
    found: list[Run] = []
    for root in map(Path, roots):
        if not root.is_dir():
            raise UserError(
                f"{root}: no such folder",
                f"pass the run.root your runs went to (default: ./{RunConfig.root})",
            )
        found += [read(path, _name(path, root, len(roots) > 1)) for path in _run_dirs(root)]
    if not found:
        where = ", ".join(map(str, roots))
        raise UserError(
            f"no run directory (a folder with {RunDir.CONFIG}) under {where}",
            "pass the run.root your runs went to, e.g. expctl runs runs/",
        )
    found.sort(key=lambda r: (r.started or "", r.name))
    return Runs([Path(p) for p in roots], found)


def _name(path: Path, root: Path, several: bool) -> str:
    """A run's path under its root (with the root's, when there are several roots or the root
    is the run)."""
    under = os.path.relpath(path, root)
    return os.path.normpath(root / under) if several or under == "." else under


def _run_dirs(root: Path) -> list[Path]:
    """The run directories under `root`, sorted; none is looked into (a run holds no other)."""
    out = []
    for folder, subdirs, _ in os.walk(root):
        if RunDir(folder).is_run():
            out.append(Path(folder))
            subdirs.clear()
        subdirs.sort()
    return out


def read(path: Path, name: str | None = None) -> Run:
    """One run directory from its files (a damaged one: what could be read, with a warning)."""
    run = RunDir(path)
    try:
        config = _config(run.config)
    except UserError as e:
        log.warning("%s", e.message)
        config = {}
    for key in PLACE:
        config.pop(key, None)
    result = run.read_result()
    rows = run.metric_rows()
    started = _started(run, rows)
    return Run(
        name=name or str(path),
        path=path.absolute(),
        status=state(run, result),
        config=config,
        metrics=_final(result, rows),
        best=_best(config, rows),
        wall_s=_wall(result, rows, started),
        started=None if started is None else _iso(started),
    )


def _config(path: Path) -> dict[str, Any]:
    """A run's config.yaml as dotted keys, kept in the cache folder per version of the file:
    reading YAML safely (its size and aliases bounded, then OmegaConf's parser) takes 10-40 ms
    a file, and a run's frozen config rarely changes (a resume with another setting rewrites
    it), so `expctl runs` over a project's runs would spend seconds on it every time."""
    kept = kept_path("configs", path, [path]) if path.is_file() else None
    config = read_kept(kept)
    if isinstance(config, dict):
        return config
    config = flatten(read_yaml(path, str(path)))  # its error names the file
    keep(kept, config)
    return config


def _final(result: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """result.json's metrics, else the last logged value of each (a run that has not ended)."""
    out: dict[str, float] = {}
    for row in [result] if result else rows:
        out.update(metric_values(row))
    out.pop("time/train_s", None)  # the wall_s column
    return out


def _best(config: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """The best logged value of each metric the config ranks by (checkpoint.monitor, early
    stopping's, the sweep's), in its mode."""
    modes = {}
    for section in ("checkpoint", "train.early_stop", "sweep"):
        metric = config.get(f"{section}.monitor", config.get(f"{section}.metric"))
        if isinstance(metric, str) and metric not in modes:
            modes[metric] = config.get(f"{section}.mode")
    out = {}
    for metric, mode in modes.items():
        values = [float(r[metric]) for r in rows if tables.is_number(r.get(metric))]
        values = [v for v in values if math.isfinite(v)]
        if values:
            out[metric] = min(values) if mode == "min" else max(values)
    return out


def _wall(
    result: dict[str, Any], rows: list[dict[str, Any]], started: float | None
) -> float | None:
    if tables.is_number(result.get("time/train_s")):
        return float(result["time/train_s"])
    times = [float(r["time"]) for r in rows if tables.is_number(r.get("time"))]
    return round(times[-1] - started, 3) if times and started is not None else None


def _started(run: RunDir, rows: list[dict[str, Any]]) -> float | None:
    """When the run began: config.yaml's writing, or its first logged row if that is earlier
    (a resume that changed a setting rewrites config.yaml)."""
    times = [float(r["time"]) for r in rows[:1] if tables.is_number(r.get("time"))]
    with contextlib.suppress(OSError):
        times.append(run.config.stat().st_mtime)
    return min(times, default=None)


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).isoformat(timespec="seconds")


def _short_time(iso: str | None) -> str | None:
    """`2025-03-01 14:05` for `2025-03-01T14:05:31`: the table's width is dear."""
    return None if iso is None else iso[:16].replace("T", " ")


def table(
    roots: Sequence[str | Path],
    sort: str | None = None,
    filters: Sequence[str] = (),
    columns: Sequence[str] = (),
) -> str:
    """`expctl runs`: a line per run with its final and best metrics, the config keys that
    differ between the runs shown (those that matter first: `Runs.columns`), wall time and
    start, fitted to the terminal's width; `columns`: the columns to show instead (`Runs.pick`)."""
    every = load(roots)
    res = every.select(sort, filters)
    counts = ", ".join(f"{n} {s}" for s in STATES if (n := sum(r.status == s for r in res)))
    shown = f"{len(res)} of {len(every)}" if filters else str(len(res))
    lines = [f"runs under {', '.join(map(str, roots))}  ({shown} run(s): {counts or 'none'})"]
    picked = res.pick(columns) if columns else None
    columns = picked or [c for c in res.columns() if c != "path"]
    if res.rows:
        records = [
            {**rec, "started": _short_time(rec.get("started"))} for rec in res.records(picked)
        ]
        cells = [[tables.shown(rec.get(c)) for c in columns] for rec in records]
        lines += tables.text(columns, cells)
    if len(res) > 1:
        lines.append(f"the same in every run: {len(res.same())} config key(s) (--json lists them)")
    return "\n".join(lines)


def diff(a: str | Path, b: str | Path) -> str:
    """`expctl diff A B`: status, wall time and start of each, then the config keys that differ
    (values side by side, `(unset)` where one lacks the key), then the metrics with B - A.

    Raises:
        UserError: A or B is not a run directory.
    """
    pair = Runs([], [_run_dir(a), _run_dir(b)])
    ra, rb = pair.rows
    lines = [
        f"{label}  {r.name}  {r.status}  wall {_seconds(r.wall_s)}  started {r.started or '-'}"
        for label, r in (("A", ra), ("B", rb))
    ]
    keys = pair.differing()
    lines.append(f"config: {len(keys)} key(s) differ, {len(pair.same())} the same")
    cells = [[k, *(tables.shown(r.config.get(k, UNSET)) for r in (ra, rb))] for k in keys]
    lines += _indented(["key", "A", "B"], cells)
    metrics = dict.fromkeys([*ra.metrics, *rb.metrics])
    best = dict.fromkeys([*ra.best, *rb.best])
    cells = [_delta(k, ra.metrics.get(k), rb.metrics.get(k)) for k in metrics]
    cells += [_delta(BEST + k, ra.best.get(k), rb.best.get(k)) for k in best]
    lines.append(
        f"metrics: final, and {BEST}METRIC the best validation" if cells else "metrics: none yet"
    )
    lines += _indented(["metric", "A", "B", "B - A"], cells)
    return "\n".join(lines)


def _indented(columns: list[str], cells: list[list[str]]) -> list[str]:
    """A table under a heading of `diff` (none without rows)."""
    return tables.text(columns, cells, indent="  ") if cells else []


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.4g} s"


def _run_dir(path: str | Path) -> Run:
    if not RunDir(path).is_run():
        raise UserError(
            f"{path}: not a run directory (no {RunDir.CONFIG})",
            not_a_run_hint(
                Path(path),
                "pass two folders that `expctl runs` lists, e.g. expctl diff runs/A runs/B",
            ),
        )
    return read(Path(path), str(path))


def _delta(key: str, a: float | None, b: float | None) -> list[str]:
    if a is None or b is None or not math.isfinite(b - a):
        return [key, tables.shown(a), tables.shown(b), "-"]
    return [key, tables.shown(a), tables.shown(b), f"{b - a:+.4g}"]
