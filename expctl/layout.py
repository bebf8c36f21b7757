"""What a run directory and a sweep directory hold: every file name spelled once, and its readers.

    RUN_DIR/                        SWEEP_DIR/
      config.yaml   frozen config     sweep.json    the sweep's spec (space, -C file, its sha256)
      imports.json  where imports:    journal.log   the Optuna study (the ledger)
                    modules were      best.yml      the best trial's config (`sweep best`)
                    found             imports.json  the best trial's imports.json, beside it
      .lock         held while a launch trains it (flock; who holds it); in SWEEP_DIR, by its driver
      trial.json    sweep trial id    plot_*.png    `sweep plot`
      metrics.jsonl one event a line  slurm/        submitit files of job arrays
      metrics.csv   logger=[csv]: the same events as a table
      result.json   final metrics     trial_000/    a run directory per trial
      provenance.json  how it started code/         Slurm sweeps: the code the jobs import
                    (launches: command, git; attempts: host, GPUs, package versions)
      git-ID.diff   a launch's uncommitted diff
      code/         launcher=slurm: the code the job imports (one copy per submission)
      train.log     rank 0's log
      output.log    a local sweep trial's console output
      jobs.jsonl    Slurm job events
      checkpoints/  step_*.pt, or step_*.dcp/ folders of shards (+ .sha256, .json: the
                    validation metrics of those weights)
      eval/         NAME.json: `expctl eval` results
      tb/           logger=[tensorboard]
      wandb/        logger=[wandb]: W&B's offline run files
      slurm/        submitit files of launcher=slurm

Readers skip a line being written right now (the file is appended while they read) and a
corrupt one, with a warning naming the file, so a live or damaged run can always be looked at.
A file replaced whole is written by `atomic.py`'s writer; the user's cache folder is `cache.py`;
what sweep.json must hold is checked by `sweepspec.py`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl import sweepspec
from expctl.atomic import temporaries

log = logging.getLogger("expctl")


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file, one a line. A last line without its newline is being
    written now and is skipped quietly; other unreadable lines are skipped with a warning."""
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return []
    except OSError as e:
        log.warning("cannot read %s (%s): skipped", path, e.strerror)
        return []
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()  # being written right now
    out, bad = [], 0
    for line in lines:
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, an integer of 5000 digits, nested deep
            item = None
        if isinstance(item, dict):
            out.append(item)
        else:
            bad += 1
    if bad:
        log.warning("%s: skipped %d unreadable line(s) (the file is damaged)", path, bad)
    return out


def read_imports(path: Path) -> dict[str, dict[str, str]]:
    """An imports.json: for each module of a config's ``imports:``, the ``file`` it was imported
    from and the search ``path`` folder holding it, when the run was created ({} without one; a
    warning when it cannot be read)."""
    data = _read_mapping(path)
    if not all(isinstance(v, dict) and isinstance(v.get("path"), str) for v in data.values()):
        log.warning("%s does not map modules to where they were found: ignored", path)
        return {}
    return {str(k): {"file": str(v.get("file", "")), "path": v["path"]} for k, v in data.items()}


def metric_values(row: dict[str, Any]) -> dict[str, float]:
    """The metrics of a result.json or a metrics.jsonl row: its numbers named `kind/name`
    (`val/acc`, `time/train_s`), without step, epoch, status or time."""
    return {
        k: float(v)
        for k, v in row.items()
        if "/" in k and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def _read_mapping(path: Path) -> dict[str, Any]:
    """A JSON file holding one mapping ({} without the file; a warning when it cannot be read)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested 100k deep
        log.warning("cannot read %s (%s): ignored", path, " ".join(str(e).split())[:160])
        return {}
    if not isinstance(data, dict):
        log.warning("%s does not hold a mapping: ignored", path)
        return {}
    return data


@dataclass(frozen=True)
class RunDir:
    """A run directory's files."""

    path: Path

    CONFIG = "config.yaml"
    IMPORTS = "imports.json"  # beside any config file expctl writes: see `read_imports`
    LOCK = ".lock"
    TRIAL = "trial.json"
    METRICS = "metrics.jsonl"
    CSV = "metrics.csv"
    RESULT = "result.json"
    LOG = "train.log"
    OUTPUT = "output.log"  # a sweep trial's console output (its process's stdout and stderr)
    JOBS = "jobs.jsonl"
    CHECKPOINTS = "checkpoints"
    TB = "tb"
    WANDB = "wandb"
    SLURM = "slurm"
    EVAL = "eval"
    PROVENANCE = "provenance.json"
    CODE = "code"

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    def diff(self, launch_id: str) -> Path:
        """The uncommitted diff of the user's repository when launch `launch_id` began."""
        return self.path / f"git-{launch_id}.diff"

    def diffs(self) -> list[Path]:
        """Every launch's diff file."""
        return sorted(self.path.glob("git-*.diff"))

    def eval_result(self, name: str) -> Path:
        """Where `expctl eval --name NAME` writes its result."""
        return self.path / self.EVAL / f"{name}.json"

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def imports(self) -> Path:
        return self.path / self.IMPORTS

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    @property
    def trial(self) -> Path:
        return self.path / self.TRIAL

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def csv(self) -> Path:
        return self.path / self.CSV

    @property
    def result(self) -> Path:
        return self.path / self.RESULT

    @property
    def log(self) -> Path:
        return self.path / self.LOG

    @property
    def output(self) -> Path:
        return self.path / self.OUTPUT

    @property
    def jobs(self) -> Path:
        return self.path / self.JOBS

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def tb(self) -> Path:
        return self.path / self.TB

    @property
    def slurm(self) -> Path:
        return self.path / self.SLURM

    @property
    def provenance(self) -> Path:
        return self.path / self.PROVENANCE

    @property
    def code(self) -> Path:
        return self.path / self.CODE

    def read_provenance(self) -> dict[str, Any]:
        """provenance.json: ``{"launches": [{..., "attempts": [...]}]}`` ({} without one; a
        warning when it cannot be read, or holds something else)."""
        data = _read_mapping(self.provenance)
        launches = data.get("launches", [])
        if not isinstance(launches, list) or not all(isinstance(e, dict) for e in launches):
            log.warning("%s does not hold a list of launches: ignored", self.provenance)
            return {}
        return data

    def is_run(self) -> bool:
        """Whether this folder holds a frozen config."""
        return self.config.is_file()

    def metric_rows(self) -> list[dict[str, Any]]:
        """The events of metrics.jsonl, oldest first."""
        return json_lines(self.metrics)

    def metric_series(self, metric: str, x: str = "step") -> tuple[list[float], list[float]]:
        """(x, value) of every event that holds `metric`, oldest first."""
        rows = [
            r
            for r in self.metric_rows()
            if isinstance(r.get(metric), (int, float)) and isinstance(r.get(x), (int, float))
        ]
        return [float(r[x]) for r in rows], [float(r[metric]) for r in rows]

    def job_events(self) -> list[dict[str, Any]]:
        """The Slurm job events of jobs.jsonl (submitted, started, stopped, failed), oldest first."""
        return [e for e in json_lines(self.jobs) if "job_id" in e]

    def read_result(self) -> dict[str, Any]:
        """The metrics of result.json ({} while the run has none; a warning when it cannot be
        read)."""
        return _read_mapping(self.result)

    def read_imports(self) -> dict[str, dict[str, str]]:
        """Where the run's ``imports:`` modules were found (see `read_imports`)."""
        return read_imports(self.imports)

    def checkpoint(self, step: int, sharded: bool = False) -> Path:
        """Where the checkpoint of `step` goes (`checkpoint_set` names the files beside it): a
        file, or with `sharded` a folder of every rank's shard (rank/sharded.py)."""
        return self.checkpoints / f"{_STEP}{step:09d}{_DCP if sharded else _PT}"

    def checkpoint_temporaries(self) -> list[Path]:
        """Checkpoint files (and the files beside them) a process killed mid-write left."""
        return temporaries(self.checkpoints, f"{_STEP}*") if self.checkpoints.is_dir() else []

    def checkpoint_files(self) -> list[Path]:
        """The checkpoints (files, and folders of shards), newest first."""
        if not self.checkpoints.is_dir():
            return []
        found = [
            *self.checkpoints.glob(f"{_STEP}*{_PT}"),
            *self.checkpoints.glob(f"{_STEP}*{_DCP}"),
        ]
        return sorted(found, key=lambda p: (checkpoint_step(p), p.name), reverse=True)

    def stopped(self, signame: str) -> str:
        """The last line of a run stopped by a signal: how to resume from its checkpoints, or,
        stopped before the first one was written, that the same command starts the run again."""
        again = f"run the same command with run.dir={self.path}"
        if self.checkpoint_files():
            return f"stopped by {signame}; its checkpoints are kept: {again} to resume"
        first = f"stopped by {signame} before its first checkpoint, nothing to resume"
        return f"{first}: {again} to start over"


def fresh_names(prefix: str, tries: int = 100) -> Iterator[str]:
    """Names for a new run or sweep directory, PREFIX-YYYYmmdd-HHMMSS-XXXX, another random
    suffix each: the caller makes the first that does not exist yet (`mkdir`, atomic)."""

    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(tries):
        yield f"{prefix}-{stamp}-{secrets.token_hex(2)}"


_STEP, _PT = "step_", ".pt"  # checkpoints/step_000001234.pt: sorted by name is sorted by step
_DCP = ".dcp"  # checkpoints/step_000001234.dcp/: a sharded model's checkpoint, a folder


def checkpoint_step(checkpoint: Path) -> int:
    """The step a checkpoint holds, from its name."""
    return int(checkpoint.name.removeprefix(_STEP).removesuffix(_PT).removesuffix(_DCP))


def checkpoint_digest(checkpoint: Path) -> Path:
    """The SHA-256 of a checkpoint's file, beside it (`sha256sum -c` reads it)."""
    return checkpoint.with_name(checkpoint.name + ".sha256")


def checkpoint_scores(checkpoint: Path) -> Path:
    """The step, epoch and validation metrics of a checkpoint's weights, beside it."""
    return checkpoint.with_name(checkpoint.name + ".json")


def checkpoint_set(checkpoint: Path) -> tuple[Path, Path, Path]:
    """A checkpoint's files: its weights, their SHA-256, the validation metrics of its weights."""
    return checkpoint, checkpoint_digest(checkpoint), checkpoint_scores(checkpoint)


@dataclass(frozen=True)
class SweepDir:
    """A sweep directory's files."""

    path: Path

    SPEC = "sweep.json"
    LAUNCH = ".launch.json"  # the command running the trials (provenance.json of each)
    JOURNAL = "journal.log"
    BEST = "best.yml"
    IMPORTS = RunDir.IMPORTS  # best.yml's, as a run directory holds one beside config.yaml
    SLURM = "slurm"
    CODE = RunDir.CODE  # the trials' code snapshots (Slurm sweeps)

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def spec(self) -> Path:
        return self.path / self.SPEC

    @property
    def journal(self) -> Path:
        return self.path / self.JOURNAL

    @property
    def launch(self) -> Path:
        return self.path / self.LAUNCH

    @property
    def best(self) -> Path:
        return self.path / self.BEST

    @property
    def imports(self) -> Path:
        return self.path / self.IMPORTS

    def plot(self, name: str) -> Path:
        """The PNG of `expctl sweep plot` named after the Optuna function that draws it."""
        return self.path / f"plot_{name}.png"

    @property
    def slurm(self) -> Path:
        return self.path / self.SLURM

    @property
    def code(self) -> Path:
        return self.path / self.CODE

    def trial(self, number: int) -> RunDir:
        """The run directory of trial `number`."""
        return RunDir(self.path / f"trial_{number:03d}")

    @staticmethod
    def number_of(run_dir: str | Path) -> int | None:
        """The number of the trial in `run_dir` (trial_012 -> 12), None for another folder."""
        name = Path(run_dir).name
        digits = name.removeprefix("trial_")
        return int(digits) if name.startswith("trial_") and digits.isdigit() else None

    def trials(self) -> list[RunDir]:
        """The trials' run directories that hold a frozen config, by number."""
        return [RunDir(p.parent) for p in sorted(self.path.glob(f"trial_*/{RunDir.CONFIG}"))]

    def read_spec(self, resuming: bool = False) -> dict[str, Any]:
        """sweep.json, checked for the keys and types every reader takes from it (`resuming`:
        also those that make a trial's config: the -C file, its digest, the overrides, the
        searched dimensions).

        Raises:
            UserError: it cannot be read, or is not what `expctl run -m` wrote.
        """
        return sweepspec.read(self.spec, resuming)
