"""A batch step that watches Python's cycle collector (`imports: [gcprobe]`,
`train.step=gcprobe`): whether automatic collection is on at each step, and which generations
were collected between the first and the last step (a collection's step: the steps done by then)."""

from __future__ import annotations

import gc
from typing import Any

import torch

from expctl import DataInfo, Splits, register
from expctl.builtin.steps import Supervised

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


class _Flags(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples whose features are [gc.isenabled() in the process that loaded them, ...]."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(gc.isenabled()), float(i % 2)]), i % 2


@register("datasets", "gcflags")
def gcflags(n: int = 64) -> Splits:
    """A streamed dataset (not in memory: DataLoader workers load it) that reports, in each
    sample, whether automatic collection was on where it was loaded."""
    return Splits(_Flags(n), _Flags(16), DataInfo(input_shape=(2,), num_classes=2))


@register("steps", "gcflagprobe")
class GcFlagProbe(Supervised):
    def train_step(self, ctx: Any, batch: Any) -> Any:
        LOADED.extend(batch[0][:, 0].tolist())
        return super().train_step(ctx, batch)


LOADED: list[float] = []  # gcflags' first feature of every training sample the step saw
