"""A sweep trial inside its run: `TrialHooks`, its one bookkeeping path, local and Slurm alike.

Rank 0 marks the trial running, reports each validation to the study (and to the pruner, ASHA /
median, when one is set), and records how it ended (`study.finish`). Under PBT it also judges, at
each budget point, whether the trial continues as a copy of a better one (`pbt.decide`), once
the running trials behind it (`population`) have caught up. `TrialMetric` checks on every rank,
before training, that the validation reports the sweep's metric.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config.schema import SweepConfig
from expctl.jobs import pbt
from expctl.jobs.study import (
    STUDY,
    TrialRef,
    attrs_of,
    finish,
    journal_storage,
    make_pruner,
    mark,
    open_study,
    trial_params,
)
from expctl.layout import SweepDir
from expctl.rank.hooks import Hooks

log = logging.getLogger("expctl")


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


def _current_params(run_dir: Path) -> dict[str, Any] | None:
    """A PBT trial's searched values now: its last copy's, else those it was drawn with."""
    ref = TrialRef.read(run_dir)
    if ref is None:
        return None
    lineage = attrs_of(ref).get("lineage") or []
    return dict(lineage[-1]["params"]) if lineage else pbt.typed(trial_params(ref))


# PBT: how long a trial ahead waits for the running ones behind it to reach its budget point
# (below the collective timeout that its other ranks wait in meanwhile), and how often it looks
PBT_WAIT_S = 300
PBT_POLL_S = 0.5


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
            storage = journal_storage(Path(self.ref.sweep_dir))
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
