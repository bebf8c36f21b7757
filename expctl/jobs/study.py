"""A sweep's Optuna study: opening it on the journal file, and what trials write to it.

A trial knows it is one from RUN_DIR/trial.json (`TrialRef`: its sweep and the number of its
attempt in the study), never from the user's config. `TrialHooks` (trialhooks.py) is its one
bookkeeping path, local and Slurm alike: rank 0 marks it running, reports each validation to the
study (and to the pruner, ASHA / median, when one is set) and records how it ended with `finish`.
The sweep driver only marks trials pending and records a failure that no rank could (a worker
that never started).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config.schema import SweepConfig
from expctl.errors import OutOfMemory
from expctl.layout import RunDir, SweepDir

log = logging.getLogger("expctl")
STUDY = "expctl"


def make_pruner(s: SweepConfig) -> Any:
    """Optuna's pruner for the sweep settings (ASHA = asynchronous successive halving)."""
    import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

    if s.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=s.grace, reduction_factor=s.reduction
        )
    if s.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=s.grace)
    return optuna.pruners.NopPruner()


def _sampler(s: SweepConfig, offset: int = 0) -> Any:
    import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

    seed = (s.seed + offset) % 2**32  # NumPy's range, which Optuna's samplers seed
    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    return optuna.samplers.RandomSampler(seed=seed)


def open_study(sweep_dir: Path, s: SweepConfig, create: bool = False) -> Any:
    """The sweep's Optuna study on its journal file."""
    import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = journal_storage(sweep_dir)
    direction: Any = "maximize" if s.mode == "max" else "minimize"
    if create:
        return optuna.create_study(
            storage=storage,
            study_name=STUDY,
            direction=direction,
            sampler=_sampler(s),
            pruner=make_pruner(s),
        )
    study = optuna.load_study(storage=storage, study_name=STUDY, pruner=make_pruner(s))
    # a sampler made anew with the same seed would draw the same "random" point every time the
    # study is reopened (once per local trial): offset the seed by the trials already asked
    study.sampler = _sampler(s, offset=len(study.get_trials(deepcopy=False)))
    return study


def journal_storage(sweep_dir: Path) -> Any:
    """The sweep's journal storage. While a local sweep's driver runs (`kept_storages`), one
    per journal file: Optuna's storage reads only what was appended since it last looked (other
    processes append), where a new one replays the whole journal (the driver asked for one per
    trial start, label and end: 0.35 s each by the 64th trial). Elsewhere a new one, which reads
    the file as it is now (one rewritten in place included)."""
    from optuna.storages import JournalStorage  # noqa: PLC0415 - Optuna off plain runs
    from optuna.storages.journal import JournalFileBackend  # noqa: PLC0415 - the same

    path = SweepDir(sweep_dir).journal.absolute()
    if not _KEEPING:
        return JournalStorage(JournalFileBackend(str(path)))
    backend = None if path.exists() else JournalFileBackend(str(path))  # creates it
    st = path.stat()
    key = (str(path), st.st_dev, st.st_ino)  # a journal replaced by another file: read anew
    if key not in _STORAGES:
        _STORAGES[key] = JournalStorage(backend or JournalFileBackend(str(path)))
    return _STORAGES[key]


_STORAGES: dict[tuple[str, int, int], Any] = {}
_KEEPING: list[bool] = []  # inside kept_storages (nested: one entry each)


@contextlib.contextmanager
def kept_storages() -> Iterator[None]:
    """Within: `journal_storage` keeps one storage per journal file (the driver's loop; no one
    rewrites the journal meanwhile, only appends). On leaving, they are dropped."""
    _KEEPING.append(True)
    try:
        yield
    finally:
        _KEEPING.pop()
        if not _KEEPING:
            _STORAGES.clear()


@dataclass(frozen=True)
class TrialRef:
    """Which attempt of a sweep trial a run directory holds (RUN_DIR/trial.json, written by the
    sweep): `number` is the attempt's in the Optuna study; the trial's own number is its
    directory's (a retry of trial_001 is a later attempt)."""

    sweep_dir: str
    number: int

    def write(self, run_dir: Path, sweep_id: Any = None) -> None:
        """`sweep_id`: the sweep's (its sweep.json's `created`), which a trial's folder copied
        in from another sweep does not hold."""
        data = {"sweep_dir": str(Path(self.sweep_dir).absolute()), "number": self.number}
        if sweep_id is not None:
            data["sweep_id"] = sweep_id
        RunDir(run_dir).trial.write_text(json.dumps(data) + "\n")

    @staticmethod
    def read(run_dir: str | Path | None) -> TrialRef | None:
        """The trial `run_dir` holds, or None for a run outside any sweep."""
        if run_dir is None or not RunDir(run_dir).trial.is_file():
            return None
        try:
            data = json.loads(RunDir(run_dir).trial.read_text())
            here = Path(os.path.normpath(Path(run_dir).absolute())).parent
            # a trial lies in its sweep's directory: where that is now, if the sweep was moved
            sweep_dir = here if SweepDir(here).journal.is_file() else Path(data["sweep_dir"])
            return TrialRef(str(sweep_dir), int(data["number"]))
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("%s is damaged: this run is not recorded in a sweep", RunDir(run_dir).trial)
            return None

    def trial_id(self, storage: Any) -> int:
        study_id = storage.get_study_id_from_name(STUDY)
        return int(storage.get_trial_id_from_study_id_trial_number(study_id, self.number))


def mark(ref: TrialRef, status: str, **attrs: Any) -> None:
    """Record a trial's status (and other attributes) in the ledger."""
    storage = journal_storage(Path(ref.sweep_dir))
    trial_id = ref.trial_id(storage)
    for k, v in {"status": status, **attrs}.items():
        storage.set_trial_user_attr(trial_id, k, v)


def attrs_of(ref: TrialRef) -> dict[str, Any]:
    """The attributes the ledger holds for a trial's attempt (status, overrides, ...)."""
    storage = journal_storage(Path(ref.sweep_dir))
    return dict(storage.get_trial(ref.trial_id(storage)).user_attrs)


def trial_params(ref: TrialRef) -> dict[str, Any]:
    """The values the study drew for a trial's attempt (as the ledger keeps them: override text)."""
    storage = journal_storage(Path(ref.sweep_dir))
    return dict(storage.get_trial(ref.trial_id(storage)).params)


def is_open(ref: TrialRef, s: SweepConfig) -> bool:
    """Whether the study has not yet recorded how the trial ended (False when the sweep's
    journal is gone, or has no such trial)."""
    if not SweepDir(ref.sweep_dir).journal.is_file():
        return False
    trials = open_study(Path(ref.sweep_dir), s).get_trials(deepcopy=False)
    return ref.number < len(trials) and not trials[ref.number].state.is_finished()


SHARE_ENV = "EXPCTL_TRIAL_SHARE"  # trials that may share this trial's GPU (set by the driver)


def failure_text(error: BaseException) -> str:
    """How the ledger says why a trial failed: its error's first line; running out of GPU
    memory on a shared GPU says which setting packed it there."""
    shared = int(os.environ.get(SHARE_ENV, "1") or 1)
    out_of_memory = isinstance(error, OutOfMemory) or type(error).__name__ == "OutOfMemoryError"
    if out_of_memory and shared > 1:
        return (
            f"CUDA out of memory on a GPU shared by up to {shared} trials: give each trial more "
            "of it (raise sweep.gpus_per_trial) or lower data.batch_size"
        )
    if isinstance(error, OutOfMemory):  # its one line says what to change
        return str(error)
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def finish(
    ref: TrialRef, s: SweepConfig, metrics: dict[str, Any], error: BaseException | None = None
) -> None:
    """Tell the study how the trial ended: completed, stopped (pruned) or failed."""
    import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

    study = open_study(Path(ref.sweep_dir), s)
    number = ref.number
    ended = {"ended": time.time(), "epoch": metrics.get("epoch"), "step": metrics.get("step")}
    if error is not None:
        text = failure_text(error)
        mark(ref, "failed", error=text, **ended)
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    elif metrics.get("status") == "stopped":
        mark(ref, "stopped", **ended)
        study.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
    else:
        value = metrics.get(s.metric)
        if value is None:
            mark(ref, "failed", error=f"no metric {s.metric!r} in the result", **ended)
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            return
        _report_last(study, ref, s, metrics, float(value))
        mark(ref, "completed", **ended)
        study.tell(number, float(value), skip_if_finished=True)


def _report_last(
    study: Any, ref: TrialRef, s: SweepConfig, metrics: dict[str, Any], value: float
) -> None:
    """The final metric as the trial's last intermediate value, unless a validation at that
    budget reported it: a trial that ended inside an epoch (train.max_steps) has a point too."""
    import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

    budget = metrics.get(s.budget)
    trial = study.get_trials(deepcopy=False)[ref.number]
    if trial.state.is_finished() or not isinstance(budget, int):
        return
    if budget not in trial.intermediate_values:
        optuna.trial.Trial(study, ref.trial_id(journal_storage(Path(ref.sweep_dir)))).report(
            value, budget
        )
