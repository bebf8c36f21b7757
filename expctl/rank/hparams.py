"""train.hparam_schedule: optimizer and loss values that change at given steps of a run (what
PBT's exploit continues with, and what `sweep best` replays): `HParams`, which the loop asks
before each optimizer step."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from expctl.errors import UserError

if TYPE_CHECKING:
    from expctl.rank.build import Parts

log = logging.getLogger("expctl")


class HParams:
    """train.hparam_schedule: each entry's optimizer and loss values, set before the optimizer
    step that follows its `step` (a run restored at step S gets those of every entry up to S).

    Optimizer values go into every param group (what `checkpoint.resume` restored included),
    loss values onto the loss module's attribute of that name.

    Raises:
        UserError: a loss value its module has no attribute for (it could not change mid-run).
    """

    def __init__(self, schedule: list[dict[str, Any]], parts: Parts | None) -> None:
        self.entries = sorted(schedule, key=lambda e: int(e["step"]))
        self.parts, self._next = parts, 0
        loss = parts.ctx.loss_fn if parts is not None else None
        for e in self.entries:
            for key in e.get("loss", {}):
                if not hasattr(loss, key):
                    raise UserError(
                        f"train.hparam_schedule: loss.{key} cannot change mid-run (the loss "
                        f"module has no attribute '{key}')",
                        "schedule optimizer values, or loss arguments its module keeps as such",
                    )

    @property
    def next_step(self) -> float:
        """The step of the next entry to apply (infinity: none left)."""
        return int(self.entries[self._next]["step"]) if self._next < len(self.entries) else math.inf

    def at(self, step: int) -> None:
        """Apply every entry not yet applied whose step is at most `step`."""
        while self._next < len(self.entries) and int(self.entries[self._next]["step"]) <= step:
            entry = self.entries[self._next]
            self._next += 1
            assert self.parts is not None
            for key, value in entry.get("optim", {}).items():
                for opt in self.parts.ctx.optimizers.values():
                    for group in opt.param_groups:
                        group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
            for key, value in entry.get("loss", {}).items():
                setattr(self.parts.ctx.loss_fn, key, value)
            log.info("train.hparam_schedule: from step %d, %s", step, _values(entry))


def _values(entry: dict[str, Any]) -> str:
    return " ".join(
        f"{section}.{k}={v}"
        for section in ("optim", "loss")
        for k, v in entry.get(section, {}).items()
    )
