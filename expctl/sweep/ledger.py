"""Reading a sweep: its trials by number, ended, running or not started yet (`best.py` picks the
best one).

The ledger is the sweep's Optuna journal (SWEEP_DIR/journal.log): per trial its status, the
overrides that define it, the metric it reported, its wall time and, when it failed, the first
line of the error. It can be read while trials still run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl.cache import keep, kept_path, read_kept
from expctl.config import frozen as config_mod
from expctl.config.explain import parse_override
from expctl.config.schema import PBTConfig, SweepConfig
from expctl.errors import UserError
from expctl.jobs.slurmstate import FINAL_STATES, job_states
from expctl.jobs.study import open_study
from expctl.layout import RunDir, SweepDir, json_lines, metric_values

log = logging.getLogger("expctl")

STATES = {
    "RUNNING": "running",
    "WAITING": "pending",
    "COMPLETE": "completed",
    "PRUNED": "stopped",
    "FAIL": "failed",
}


# interrupted: stopped by the user (Ctrl-C) at a checkpoint; lost: its process or job died
# without a word (a killed driver, a crashed node); `sweep resume` continues both, and failed ones
STATUSES = ("pending", "running", "completed", "stopped", "interrupted", "failed", "lost")
UNFINISHED = ("interrupted", "failed", "lost")


@dataclass
class Row:
    """One trial of the sweep: a configuration (and seed) with its number, which names its
    directory (trial N lives in SWEEP_DIR/trial_00N), whether it ran yet or not."""

    number: int
    status: str  # one of STATUSES; `pending`: not started yet
    overrides: str
    config: str  # the swept values as the ledger holds them (JSON): equal for repeats
    value: float | None  # the sweep's metric: the final one, else the last validation's
    best: float | None  # the best value of the metric over the trial's validations
    epoch: int | None
    wall_s: float | None
    error: str
    run_dir: str
    params: dict[str, Any]  # the swept values as Python values (`[8]` is a list)
    step: int | None = None  # optimizer steps done when the trial ended
    seed_idx: int = 0  # which repeat of its configuration (train.seed = the base seed + seed_idx)
    seed: int | None = (
        None  # its train.seed (None: not started, or a sweep from before it was kept)
    )
    metrics: dict[str, float] = field(default_factory=dict)  # result.json's, e.g. test/acc
    optuna_trial: int | None = None  # its latest attempt in the Optuna study; None: not started
    # PBT: each copy of another trial, oldest first: {"step", "from_trial", "params", "time"}
    lineage: list[dict[str, Any]] = field(default_factory=list)
    # its folder holds a run that is not this attempt's (put there by hand): the row shows what
    # the journal recorded, nothing read from the folder
    foreign: bool = False


def require(path: Path) -> None:
    """Raises UserError unless `path` is a sweep directory (its journal and sweep.json)."""
    if not Path(path).is_dir():
        raise UserError(
            f"{path}: {'not a directory' if Path(path).exists() else 'no such directory'}",
            "pass the sweep directory `expctl run -m` printed",
        )
    for name in (SweepDir.JOURNAL, SweepDir.SPEC):
        if not (Path(path) / name).is_file():
            raise UserError(
                f"{path}: not a sweep directory (no {name})",
                "pass the folder `expctl run -m` printed",
            )


def settings(sweep_dir: Path) -> Any:
    sweep = SweepDir(sweep_dir)
    require(sweep_dir)
    trials = sweep.trials()
    if not trials:
        return SweepConfig()
    frozen = RunDir(trials[0].path).config
    kept = kept_path("sweep-settings", frozen, [frozen])
    values = read_kept(kept)
    if isinstance(values, dict):
        with contextlib.suppress(TypeError):  # kept by another version of expctl
            return SweepConfig(**{**values, "pbt": PBTConfig(**values["pbt"])})
    s = config_mod.load(trials[0].path).sweep
    keep(kept, dataclasses.asdict(s))
    return s


def planned(spec: dict[str, Any]) -> list[tuple[dict[str, Any], int]]:
    """The sweep's trials by number: (its grid point, or {} for a point the sampler picks when
    the trial starts; its seed index), repeats of a configuration next to each other."""
    points = spec.get("points") or [{}] * int(spec.get("n_trials") or 0)
    return [(p, i) for p in points for i in range(int(spec.get("repeat") or 1))]


def label(params: dict[str, Any], seed_idx: int) -> str:
    """A trial's overrides as the table shows them: `optim.lr=0.1 seed#1`."""
    text = " ".join(f"{k}={v}" for k, v in params.items())
    return (text + (f" seed#{seed_idx}" if seed_idx else "")).strip() or "(base)"


def typed(params: dict[str, Any]) -> dict[str, Any]:
    """Swept values as Python values: grid points and choices are kept as Hydra override text
    (`0.01`, `[8]`), read back here by Hydra's own grammar."""
    return {
        k: parse_override(f"k={v}").value() if isinstance(v, str) else v for k, v in params.items()
    }


def rows(sweep_dir: str | Path) -> list[Row]:
    """Every trial of the sweep by number: the latest attempt of each one the journal holds
    (a retry replaces the attempt it repeats, in the same directory), then the ones it has not
    started yet (`pending`)."""
    path = Path(sweep_dir)
    s = settings(path)
    # a sweep whose trials all ended reads the same until a file below changes: what was read
    # of it is kept (`sweep table` answers without Optuna's import and replay of the journal)
    dirs_now = SweepDir(path).trials()
    files = [SweepDir(path).journal, SweepDir(path).spec]
    files += [f for r in dirs_now for f in (r.metrics, r.result, r.trial)]
    kept = kept_path("sweep-rows", path, files)
    cached = read_kept(kept)
    if isinstance(cached, list):
        with contextlib.suppress(TypeError):  # kept by another version of expctl
            return _said_foreign([Row(**r) for r in cached])
    latest: dict[int, Any] = {}
    earlier: dict[int, float] = {}  # the wall time of a trial's attempts before its latest
    trials, whole = _journal_trials(path, s)
    for t in trials:  # in attempt order: a retry comes after what it retries
        n = number_of(t)
        if n in latest:
            spent = _wall(latest[n].user_attrs, t.user_attrs, SweepDir(path).trial(n).metrics)
            earlier[n] = earlier.get(n, 0.0) + (spent or 0.0)
        latest[n] = t
    # where the sweep lies now
    dirs = {n: os.path.normpath(SweepDir(path).trial(n).path.absolute()) for n in latest}
    states = _job_states([{**t.user_attrs, "run_dir": dirs[n]} for n, t in latest.items()])
    try:
        spec = SweepDir(path).read_spec() if SweepDir(path).spec.is_file() else {}
    except UserError as e:  # the trials the journal holds still show
        log.warning("%s: trials not started yet are not listed", e.message)
        spec, whole = {}, False
    sweep_id = spec.get("created")
    out = [_row(n, t, s, states, dirs[n], earlier.get(n, 0.0), sweep_id) for n, t in latest.items()]
    for n, (params, seed_idx) in enumerate(planned(spec)):
        if n not in latest:
            out.append(_unstarted(path, n, params, seed_idx, sampled=not spec.get("points")))
    out.sort(key=lambda r: r.number)
    _said_foreign(out)
    if whole and not any(r.status in ("pending", "running") for r in out):
        keep(kept, [dataclasses.asdict(r) for r in out])
    return out


def _journal_trials(path: Path, s: SweepConfig) -> tuple[list[Any], bool]:
    """The journal's trials, with a warning for trial folders it holds no record of; and
    whether it was whole (no warning)."""
    journal = SweepDir(path).journal
    trials = read_study(path, s).get_trials(deepcopy=False)
    whole = journal.read_bytes().endswith(b"\n")
    if not whole:
        log.warning("%s: its last line is incomplete (being written, or truncated)", journal)
    # by name: the sweep may have been moved since the journal recorded its trials' paths
    recorded = {Path(t.user_attrs["run_dir"]).name for t in trials if "run_dir" in t.user_attrs}
    missing = [r.path.name for r in SweepDir(path).trials() if r.path.name not in recorded]
    if missing:
        log.warning(
            "%s holds no record of %s: a folder the sweep did not make, or one its journal lost",
            journal,
            ", ".join(missing[:5]),
        )
    return list(trials), whole and not missing


# what Optuna's replay of a damaged journal raises: a line not JSON, nested too deep, of another
# shape, an unknown operation ("Should not reach."), no study at all (empty)
_DAMAGE = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, AssertionError)


def read_study(path: Path, s: SweepConfig, to_write: bool = False) -> Any:
    """The sweep's Optuna study with its journal read (`sweep table`, `best`, `resume`).

    Args:
        to_write: records will be appended (`sweep resume`): every line must be JSON. Optuna
            reads past a damaged last line (one being written) but not past one followed by more.

    Raises:
        UserError: the journal is missing or damaged beyond reading.
    """
    journal = SweepDir(path).journal
    require(path)  # Optuna would make an empty journal
    try:
        if to_write:
            for line in journal.read_bytes().splitlines():
                json.loads(line)
        study = open_study(path, s)
        study.get_trials(deepcopy=False)
    except (*_DAMAGE, RecursionError) as e:
        raise UserError(
            f"{journal} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]})",
            "each trial's folder (trial_NNN/result.json, metrics.jsonl) still holds its results",
        ) from None
    return study


def number_of(trial: Any) -> int:
    """The trial's number: its directory's (an attempt's Optuna number differs after a retry)."""
    number = SweepDir.number_of(trial.user_attrs.get("run_dir", ""))
    return trial.number if number is None else number


def _job_states(attrs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Slurm's view of the jobs of trials still marked pending or running."""
    open_attrs = [a for a in attrs if a.get("status") in ("running", "pending")]
    jobs = [j for j in map(_job_of, open_attrs) if j is not None]
    return job_states(jobs) if jobs and shutil.which("squeue") else {}


def _row(
    number: int,
    t: Any,
    s: SweepConfig,
    states: dict[str, dict[str, str]],
    run_dir: str,
    earlier: float = 0.0,
    sweep_id: Any = None,
) -> Row:
    """Trial `number` from its latest attempt `t`, its directory `run_dir` as the sweep lies now
    (`earlier`: the wall time of its attempts before, which its own adds to; `sweep_id`: the
    sweep's, which its trial.json holds unless copied in from another sweep)."""
    a = {**t.user_attrs, "run_dir": run_dir}
    status = a.get("status") or STATES.get(t.state.name, t.state.name.lower())
    status = "running" if status == "copying" else status  # PBT: between two of its runs
    if status in ("running", "pending") and not _alive(a, states):
        status = "lost"
    run = RunDir(run_dir)
    foreign = _foreign(run, t.number, sweep_id)
    steps, history = run.metric_series(s.metric) if not foreign else ([], [])
    result = run.read_result() if not foreign else {}
    # a trial that has not ended: where its last validation was (it recorded none yet)
    epoch, step = a.get("epoch"), a.get("step")
    if step is None and steps:
        step, epoch = int(steps[-1]), int(run.metric_series(s.metric, "epoch")[0][-1])
    return Row(
        number=number,
        status=status,
        overrides=a.get("overrides", ""),
        config=a.get("config", "{}"),
        value=t.value if t.value is not None else (history[-1] if history else None),
        best=(max(history) if s.mode == "max" else min(history)) if history else None,
        epoch=epoch,
        wall_s=None if (wall := _wall(a)) is None else earlier + wall,
        error=a.get("error")
        or ("its folder holds a run the sweep did not start" if foreign else ""),
        run_dir=run_dir,
        params=typed(dict(t.params)),
        step=step,
        seed_idx=int(a.get("seed_idx", 0)),
        seed=a.get("seed"),
        metrics=metric_values(result),
        optuna_trial=t.number,
        lineage=list(a.get("lineage") or []),
        foreign=foreign,
    )


_told_foreign: set[str] = set()  # folders this process warned about (a driver reads rows often)


def _said_foreign(out: list[Row]) -> list[Row]:
    new = [r.run_dir for r in out if r.foreign and r.run_dir not in _told_foreign]
    _told_foreign.update(new)
    if foreign := [Path(d).name for d in new]:
        log.warning(
            "%s: a run the sweep did not start (put there by hand); the table shows what the "
            "journal recorded",
            ", ".join(foreign[:5]),
        )
    return out


def _foreign(run: RunDir, attempt: int, sweep_id: Any) -> bool:
    """Whether `run` holds a run, but not of this attempt of this sweep (its trial.json names
    another attempt or another sweep, or none: copied or trained there by hand)."""
    if not run.config.is_file():
        return False
    try:
        ref = json.loads(run.trial.read_text())
        theirs = ref.get("sweep_id")
        other = sweep_id is not None and theirs is not None and theirs != sweep_id
        return int(ref["number"]) != attempt or other
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True


def _wall(
    attrs: dict[str, Any], retry: dict[str, Any] | None = None, metrics: Path | None = None
) -> float | None:
    """An attempt's wall time once it ended (None before). Given its `retry`'s attributes: an
    attempt that never recorded its end (lost: its driver was killed) lasted until the last
    metrics row it wrote, before the retry started (0 without one)."""
    if "ended" in attrs and "started" in attrs:
        return float(attrs["ended"]) - float(attrs["started"])
    if retry is None or "started" not in attrs:
        return None if retry is None else 0.0
    begun, next_begun = float(attrs["started"]), float(retry.get("started", math.inf))
    times = [float(r["time"]) for r in json_lines(metrics) if "time" in r] if metrics else []
    return max([begun, *(x for x in times if begun <= x < next_begun)]) - begun


def _unstarted(path: Path, n: int, params: dict[str, Any], seed_idx: int, sampled: bool) -> Row:
    return Row(
        number=n,
        status="pending",
        overrides="(sampled when it starts)" if sampled else label(params, seed_idx),
        config=json.dumps(params, sort_keys=True),
        value=None,
        best=None,
        epoch=None,
        wall_s=None,
        error="",
        run_dir=os.path.normpath(SweepDir(path).trial(n).path.absolute()),
        params=typed(params),
        seed_idx=seed_idx,
    )


def _job_of(attrs: dict[str, Any]) -> str | None:
    events = RunDir(attrs["run_dir"]).job_events() if attrs.get("run_dir") else []
    return str(events[-1]["job_id"]) if events else None


def _alive(attrs: dict[str, Any], states: dict[str, dict[str, str]]) -> bool:
    """Whether a trial still marked pending/running has a live process or Slurm job (a job
    Slurm cannot tell us about counts as alive: only a final state makes a trial lost)."""
    job = _job_of(attrs)
    if job is not None:
        return states.get(job, {}).get("state", "UNKNOWN") not in FINAL_STATES
    pid, host = attrs.get("pid"), attrs.get("host")  # the trial's process, else its driver's
    if pid is None:  # a record older than pids for pending trials: trust it
        return attrs.get("status") == "pending"
    if host != socket.gethostname():
        return True  # cannot tell from here
    try:
        os.kill(int(pid), 0)
    except OSError:
        return False
    try:  # a zombie is dead: its parent (a killed sweep's zygote) is gone, its reaper slow
        return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
