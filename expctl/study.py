"""A sweep's Optuna study: opening it on the journal file, and what trials write to it.

`mark` and `finish` record a trial's status and outcome (the driver for local trials, rank 0 of
the job for Slurm trials); `Pruner` is rank 0's link for ASHA / median decisions at validation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from expctl.config import Config, SweepConfig

JOURNAL = "journal.log"
STUDY = "expctl"


def make_pruner(s: SweepConfig) -> Any:
    """Optuna's pruner for the sweep settings (ASHA = asynchronous successive halving)."""
    import optuna

    if s.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=s.grace, reduction_factor=s.reduction
        )
    if s.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=s.grace)
    return optuna.pruners.NopPruner()


def _sampler(s: SweepConfig, offset: int = 0) -> Any:
    import optuna

    if s.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=s.seed + offset, constant_liar=True)
    return optuna.samplers.RandomSampler(seed=s.seed + offset)


def open_study(sweep_dir: Path, s: SweepConfig, create: bool = False) -> Any:
    """The sweep's Optuna study on its journal file."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL)))
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


def mark(cfg: Config, status: str, **attrs: Any) -> None:
    """Record a trial's status (and other attributes) in the ledger."""
    if cfg.sweep.storage is None or cfg.sweep.trial is None:
        return
    study = open_study(Path(cfg.sweep.storage), cfg.sweep)
    trial_id = study._storage.get_trial_id_from_study_id_trial_number(
        study._study_id, cfg.sweep.trial
    )
    for k, v in {"status": status, **attrs}.items():
        study._storage.set_trial_user_attr(trial_id, k, v)


def finish(cfg: Config, metrics: dict[str, Any], error: BaseException | None = None) -> None:
    """Tell the study how the trial ended: completed, stopped (pruned) or failed."""
    import optuna

    if cfg.sweep.storage is None or cfg.sweep.trial is None:
        return
    study = open_study(Path(cfg.sweep.storage), cfg.sweep)
    number = cfg.sweep.trial
    ended = {"ended": time.time(), "epoch": metrics.get("epoch"), "step": metrics.get("step")}
    if error is not None:
        text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
        mark(cfg, "failed", error=text, **ended)
        study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
    elif metrics.get("status") == "stopped":
        mark(cfg, "stopped", **ended)
        study.tell(number, state=optuna.trial.TrialState.PRUNED, skip_if_finished=True)
    else:
        value = metrics.get(cfg.sweep.metric)
        if value is None:
            mark(cfg, "failed", error=f"no metric {cfg.sweep.metric!r} in the result", **ended)
            study.tell(number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            return
        mark(cfg, "completed", **ended)
        study.tell(number, float(value), skip_if_finished=True)


class Pruner:
    """Called by rank 0 at each validation of a trial: report, and ask whether to stop."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.study = open_study(Path(str(cfg.sweep.storage)), cfg.sweep)
        storage = self.study._storage
        self.trial_id = storage.get_trial_id_from_study_id_trial_number(
            self.study._study_id, cfg.sweep.trial
        )

    def should_stop(self, metrics: dict[str, float], epoch: int, step: int) -> bool:
        import optuna

        value = metrics.get(self.cfg.sweep.metric)
        if value is None:
            return False
        trial = optuna.trial.Trial(self.study, self.trial_id)
        trial.report(float(value), epoch if self.cfg.sweep.budget == "epoch" else step)
        return bool(trial.should_prune())
