"""A sweep's Optuna study: opening it on the journal file, and what trials write to it.

A trial knows it is one from RUN_DIR/trial.json (`TrialRef`: its sweep and the number of its
attempt in the study), never from the user's config. `TrialHooks` is its one bookkeeping path,
local and Slurm alike: rank 0 marks it running, reports each validation to the study (and to
the pruner, ASHA / median, when one is set) and records how it ended with `finish`. The sweep driver only marks trials pending and records a failure that no
rank could (a worker that never started).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config.schema import SweepConfig
from expctl.errors import OutOfMemory
from expctl.jobs import pbt
from expctl.layout import RunDir, SweepDir
from expctl.rank.hooks import Hooks

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
    storage = _storage(sweep_dir)
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


def _storage(sweep_dir: Path) -> Any:
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
    """Within: `_storage` keeps one storage per journal file (the driver's loop; no one
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
    storage = _storage(Path(ref.sweep_dir))
    trial_id = ref.trial_id(storage)
    for k, v in {"status": status, **attrs}.items():
        storage.set_trial_user_attr(trial_id, k, v)


@dataclass
class Member:
    """A running PBT trial as the others see it: its score and step at each budget point it
    reached (str keys: the journal's JSON)."""

    scores: dict[str, float]
    steps: dict[str, int]


def population(sweep_dir: Path, s: SweepConfig) -> dict[int, Member]:
    """PBT's population: the running trials, by their directory's number."""
    latest: dict[int, Any] = {}
    for t in open_study(sweep_dir, s).get_trials(deepcopy=False):
        number = SweepDir.number_of(t.user_attrs.get("run_dir", ""))
        if number is not None:
            latest[number] = t
    return {
        n: Member(
            {b: float(v) for b, v in (t.user_attrs.get("pbt_scores") or {}).items()},
            {b: int(v) for b, v in (t.user_attrs.get("pbt_steps") or {}).items()},
        )
        for n, t in latest.items()
        if t.user_attrs.get("status") == "running"
    }


def attrs_of(ref: TrialRef) -> dict[str, Any]:
    """The attributes the ledger holds for a trial's attempt (status, overrides, ...)."""
    storage = _storage(Path(ref.sweep_dir))
    return dict(storage.get_trial(ref.trial_id(storage)).user_attrs)


def trial_params(ref: TrialRef) -> dict[str, Any]:
    """The values the study drew for a trial's attempt (as the ledger keeps them: override text)."""
    storage = _storage(Path(ref.sweep_dir))
    return dict(storage.get_trial(ref.trial_id(storage)).params)


def _current_params(run_dir: Path) -> dict[str, Any] | None:
    """A PBT trial's searched values now: its last copy's, else those it was drawn with."""
    ref = TrialRef.read(run_dir)
    if ref is None:
        return None
    lineage = attrs_of(ref).get("lineage") or []
    return dict(lineage[-1]["params"]) if lineage else pbt.typed(trial_params(ref))


def is_open(ref: TrialRef, s: SweepConfig) -> bool:
    """Whether the study has not yet recorded how the trial ended (False when the sweep's
    journal is gone, or has no such trial)."""
    if not SweepDir(ref.sweep_dir).journal.is_file():
        return False
    trials = open_study(Path(ref.sweep_dir), s).get_trials(deepcopy=False)
    return ref.number < len(trials) and not trials[ref.number].state.is_finished()


# PBT: how long a trial ahead waits for the running ones behind it to reach its budget point
# (below the collective timeout that its other ranks wait in meanwhile), and how often it looks
PBT_WAIT_S = 300
PBT_POLL_S = 0.5

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
        optuna.trial.Trial(study, ref.trial_id(_storage(Path(ref.sweep_dir)))).report(value, budget)


class TrialMetric(Hooks):
    """Every rank of a sweep's trial (the monitors check is collective): the validation metric
    the sweep ranks trials by, checked before the trial trains, so a typo fails it at once."""

    def __init__(self, s: SweepConfig) -> None:
        self.metric = s.metric

    def monitors(self) -> dict[str, str]:
        return {"sweep.metric": self.metric} if self.metric.startswith("val/") else {}


class TrialHooks(Hooks):
    """A sweep trial inside its run: rank 0 marks it running, reports each validation to the
    pruner and records how it ended. `record_failures`: False in the workers of a local launch,
    whose agent may restart them (the sweep driver records the failure once it is final)."""

    def __init__(
        self,
        ref: TrialRef,
        s: SweepConfig,
        is_main: bool,
        record_failures: bool = True,
        last_epoch: int | None = None,
        last_step: int | None = None,
    ) -> None:
        self.ref, self.s, self.is_main, self.record_failures = ref, s, is_main, record_failures
        # the run's budget (train.max_epochs, train.max_steps): its last validation ends it
        self.last_epoch, self.last_step = last_epoch, last_step
        self._study: Any = None
        self._trial_id = -1
        self._run_dir = Path()
        self._scores: dict[str, float] = {}  # PBT: this trial's score at each budget point
        self._steps: dict[str, int] = {}  # PBT: its step there (its checkpoint's)
        self._judged = -1  # PBT: the budget point this trial was last compared at
        self._copies = False  # PBT: the run stops to continue from another trial's checkpoint

    def on_start(self, run_dir: Path) -> None:
        self._run_dir = run_dir
        if self.is_main:
            attrs = attrs_of(self.ref)
            # a PBT copy's next run is the same attempt: its wall time counts from the first
            mark(self.ref, "running", started=attrs.get("started", time.time()))
            if self.s.scheduler == "pbt":  # a copy goes on: its scores so far stay its own
                self._scores = dict(attrs.get("pbt_scores") or {})
                self._steps = dict(attrs.get("pbt_steps") or {})
                self._judged = int(attrs.get("pbt_judged", -1))

    def checkpoint_first(self) -> bool:
        return self.s.scheduler == "pbt"  # a donor's weights, there before their score

    def on_validation(self, metrics: dict[str, float], epoch: int, step: int) -> bool:
        """Report the metric to the study (every trial: `sweep plot` draws it), then ask the
        pruner, if any, whether to stop; never at the run's last validation: the trial trained
        its whole budget, so it completed (ASHA's top rung is the budget, as Ray Tune's max_t;
        Optuna's SuccessiveHalvingPruner knows no budget and would "stop" a trial there that
        reached it after a better one, side by side)."""
        value = metrics.get(self.s.metric)
        if not self.is_main or value is None:
            return False
        import optuna  # noqa: PLC0415 - Optuna off plain runs (launch imports this)

        if self._study is None:
            storage = _storage(Path(self.ref.sweep_dir))
            self._study = optuna.load_study(
                storage=storage, study_name=STUDY, pruner=make_pruner(self.s)
            )
            self._trial_id = self.ref.trial_id(storage)
        trial = optuna.trial.Trial(self._study, self._trial_id)
        with warnings.catch_warnings():  # a PBT copy may report a step again: Optuna keeps one
            warnings.simplefilter("ignore")
            trial.report(float(value), epoch if self.s.budget == "epoch" else step)
        last = self._at_end(epoch, step)
        if self.s.scheduler == "pbt":
            budget = epoch if self.s.budget == "epoch" else step
            return self._pbt(float(value), epoch, step, budget, last)
        stop = self.s.pruner != "none" and not last and bool(trial.should_prune())
        if stop:
            log.info("sweep: this trial stopped early at epoch %d (%s)", epoch, self.s.pruner)
        return stop

    def _at_end(self, epoch: int, step: int) -> bool:
        """Whether the validation at `epoch` / `step` is the run's last (its budget spent)."""
        return (self.last_epoch is not None and epoch >= self.last_epoch) or (
            self.last_step is not None and step >= self.last_step
        )

    def _pbt(self, value: float, epoch: int, step: int, budget: int, last: bool) -> bool:
        """Population Based Training: record the score (and step) at this budget point; every
        `pbt.interval` epochs (not at the last), stop to continue from a better trial's
        checkpoint when this one is in the bottom quantile of the running trials scored here.
        Trials compare at equal training: one ahead waits here (up to `PBT_WAIT_S`) until the
        running ones behind it have reached this point; past that, it is compared at the newest
        point it shares with another (late, not never)."""
        b = str(budget)
        self._scores[b], self._steps[b] = value, step
        # told once its checkpoint is written (checkpoint_first): a copy takes those weights
        mark(self.ref, "running", pbt_scores=self._scores, pbt_steps=self._steps)
        me = SweepDir.number_of(self._run_dir)
        if epoch % self.s.pbt.interval or last or me is None:
            return False
        others = self._caught_up(me, b)
        shared = [
            p
            for p in self._scores
            if int(p) > self._judged and any(p in m.scores for m in others.values())
        ]
        if not shared:
            return False
        at = max(shared, key=int)
        self._judged = int(at)
        mark(self.ref, "running", pbt_judged=self._judged)
        scores = {n: m.scores[at] for n, m in others.items() if at in m.scores}
        scores[me] = value = self._scores[at]
        budget = int(at)
        rng = pbt.rng_for(self.s.seed, me, budget)
        donor = pbt.decide(me, scores, self.s.pbt.quantile, self.s.mode, rng)
        if donor is None:
            return False
        donor_dir = SweepDir(self.ref.sweep_dir).trial(donor).path
        donor_step = others[donor].steps.get(at)  # (None: a sweep from before steps were kept)
        frozen = pbt.freeze(donor_dir, self._run_dir, donor_step)
        if frozen is None:
            log.info(
                "pbt: trial %d's checkpoint of the weights compared (step %s) is gone (pruned: "
                "a larger checkpoint.keep keeps it): this trial goes on as it is",
                donor,
                donor_step,
            )
            return False
        decision = {
            "from_trial": donor,
            "checkpoint": str(frozen),
            "time": time.time(),
            # what explore perturbs (Ray Tune's PBT): the donor's values, as they made its weights
            "params": _current_params(donor_dir),
        }
        mark(self.ref, "copying", pbt_next=decision)
        log.info(
            "pbt: %s=%.4g is in the bottom %g of %d trials at %s %d: continuing from trial %d",
            self.s.metric,
            value,
            self.s.pbt.quantile,
            len(scores),
            self.s.budget,
            budget,
            donor,
        )
        self._copies = True
        return True

    def _caught_up(self, me: int, b: str) -> dict[int, Member]:
        """The other running trials, once each has reached budget point `b` (or `PBT_WAIT_S`
        passed: trials behind compare where they are)."""
        deadline = time.monotonic() + PBT_WAIT_S
        while True:
            others = population(Path(self.ref.sweep_dir), self.s)
            others.pop(me, None)
            behind = sorted(  # (one that copied a newer checkpoint may have skipped `b`)
                n for n, m in others.items() if max(map(int, m.scores), default=-1) < int(b)
            )
            if not behind:
                return others
            if time.monotonic() >= deadline:
                log.info(
                    "pbt: trial(s) %s did not reach %s %s within %d s: compared where they are",
                    ", ".join(map(str, behind)),
                    self.s.budget,
                    b,
                    PBT_WAIT_S,
                )
                return others
            time.sleep(PBT_POLL_S)

    def on_end(self, metrics: dict[str, Any]) -> None:
        if self.is_main and not self._copies:  # a PBT copy goes on: its trial has not ended
            finish(self.ref, self.s, metrics)

    def on_failure(self, error: BaseException, returning: bool) -> bool:
        if self.is_main and self.record_failures and not returning:
            finish(self.ref, self.s, {}, error=error)
        return False
