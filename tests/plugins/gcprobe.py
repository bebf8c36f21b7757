"""A training step that watches Python's cycle collector (`imports: [gcprobe]`,
`train.step=gcprobe`): whether automatic collection is on at each step, and which generations
were collected between the first and the last step (a collection's step: the steps done by then)."""

from __future__ import annotations

import gc
from typing import Any

from expctl import register
from expctl.steps import Supervised

ENABLED: list[bool] = []  # gc.isenabled() at each call of train_step
COLLECTED: list[
    tuple[int, int]
] = []  # (steps done, generation) of collections after the first step


def _watch(phase: str, info: dict[str, Any]) -> None:
    if phase == "start" and ENABLED:
        COLLECTED.append((len(ENABLED), int(info["generation"])))


def reset() -> None:
    ENABLED.clear()
    COLLECTED.clear()
    if _watch not in gc.callbacks:
        gc.callbacks.append(_watch)


def stop() -> None:
    if _watch in gc.callbacks:
        gc.callbacks.remove(_watch)


@register("steps", "gcprobe")
class GcProbe(Supervised):
    def train_step(self, ctx: Any, batch: Any) -> Any:
        ENABLED.append(gc.isenabled())
        return super().train_step(ctx, batch)
