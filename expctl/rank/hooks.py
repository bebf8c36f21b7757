"""How the launcher and the sweep take part in a run without the rank code importing them.

`rank.main` and `train.fit` call these methods on rank 0 and every other rank alike; a hook that
should act once checks `env.is_main` itself. `launch.hooks_for` builds the hooks of a run: job
records and requeues (`launch.JobHooks`) and a sweep trial's pruning and bookkeeping
(`trialhooks.TrialHooks`), chained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Hooks:
    """No-op base: override what you need."""

    def monitors(self) -> dict[str, str]:
        """Validation metrics this hook acts on, by the key naming each (`sweep.metric`):
        checked on one batch before training, so a typo fails the run before it trains. Every
        rank's hooks must name the same (the check is collective)."""
        return {}

    def on_start(self, run_dir: Path) -> None:
        """Training is about to start (or was already complete) in `run_dir`."""

    def checkpoint_first(self) -> bool:
        """Whether the weights of each epoch-end validation are checkpointed before
        `on_validation` hears their score (a PBT trial: another may copy them as soon as it
        sees the score). Every rank's hooks answer the same."""
        return False

    def on_validation(self, metrics: dict[str, float], epoch: int, step: int) -> bool:
        """After a validation at an epoch's end; True asks the run to stop there ("stopped")."""
        return False

    def on_stop(self, step: int, signame: str) -> None:
        """launcher.signal ended training at the checkpoint of `step` (before `Preempted`)."""

    def on_end(self, metrics: dict[str, Any]) -> None:
        """The run ended with `metrics` (as in result.json; status completed or stopped)."""

    def on_failure(self, error: BaseException, returning: bool) -> bool:
        """The run failed with `error`. `returning`: an earlier hook said the job comes back
        (requeued) to resume it. Returns whether this hook makes it come back."""
        return False


class Chain(Hooks):
    """Several hooks in order; a stop or a requeue asked by any of them counts."""

    def __init__(self, *hooks: Hooks) -> None:
        self.hooks = hooks

    def monitors(self) -> dict[str, str]:
        return {k: v for h in self.hooks for k, v in h.monitors().items()}

    def on_start(self, run_dir: Path) -> None:
        for h in self.hooks:
            h.on_start(run_dir)

    def checkpoint_first(self) -> bool:
        return any(h.checkpoint_first() for h in self.hooks)

    def on_validation(self, metrics: dict[str, float], epoch: int, step: int) -> bool:
        return any([h.on_validation(metrics, epoch, step) for h in self.hooks])  # ask each

    def on_stop(self, step: int, signame: str) -> None:
        for h in self.hooks:
            h.on_stop(step, signame)

    def on_end(self, metrics: dict[str, Any]) -> None:
        for h in self.hooks:
            h.on_end(metrics)

    def on_failure(self, error: BaseException, returning: bool) -> bool:
        for h in self.hooks:
            returning = h.on_failure(error, returning) or returning
        return returning
