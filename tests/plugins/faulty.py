"""Test plugin (listed under `imports:`): steps that die on purpose, to test restarts/resume."""

from __future__ import annotations

import os
import signal

from expctl import register
from expctl.steps import Supervised


@register("steps", "kill_at_step")
class KillAtStep(Supervised):
    """Supervised, but SIGKILLs this process at its micro-batch $KILL_AT_STEP (counted over the
    process: in a local sweep, across trials) on rank $KILL_RANK, only in the first attempt."""

    calls = 0

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        KillAtStep.calls += 1
        rank = os.environ.get("RANK", "0")
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        target = int(os.environ.get("KILL_AT_STEP", "-1"))
        if first and rank == os.environ.get("KILL_RANK", "0") and KillAtStep.calls == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_step(ctx, batch)


@register("models", "tiny_custom")
def tiny_custom(input_shape: tuple[int, ...] = (20,), num_classes: int = 4, width: int = 8):
    """A user-registered model."""
    import math

    from torch import nn

    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), width),
        nn.ReLU(),
        nn.Linear(width, num_classes),
    )


@register("steps", "slow")
class Slow(Supervised):
    """Supervised, sleeping $SLOW_STEP_S (default 0.05 s) per step: time to signal a running job."""

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        import time

        time.sleep(float(os.environ.get("SLOW_STEP_S", "0.05")))
        return super().train_step(ctx, batch)


@register("steps", "nan_at_step")
class NanAtStep(Supervised):
    """Supervised, but the loss of micro-batches listed in $NAN_AT_STEPS (e.g. "5,6") is NaN."""

    calls = 0

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        NanAtStep.calls += 1
        bad = {int(s) for s in os.environ.get("NAN_AT_STEPS", "").split(",") if s}
        if NanAtStep.calls in bad:
            x, y = batch
            batch = (x * float("nan"), y)
        return super().train_step(ctx, batch)


class _Made:
    """A map-style dataset whose samples are made in `__getitem__` (streamed by DataLoader
    workers): a fixed input per index, plus noise from torch's RNG (as a random transform).

    Faults, each named by "RANK:INDEX[:NTH]": the NTH read (default the first) of sample INDEX
    (the validation set's numbered after the training set's) by a DataLoader worker of rank
    RANK. $STALL_AT_SAMPLE: that read never returns. $INTERRUPT_AT_SAMPLE: it waits until its
    DataLoader shuts the workers down, then sends SIGINT to the rank (a Ctrl-C that lands while
    the rank closes its DataLoader), and never returns. $BAD_AT_SAMPLE: it raises a
    corrupt-image error."""

    reads: dict[int, int] = {}  # per process: how often each sample was read

    def __init__(self, n: int, dim: int, classes: int, offset: int) -> None:
        self.n, self.dim, self.classes, self.offset = n, dim, classes, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        import torch

        key = index + self.offset
        _Made.reads[key] = _Made.reads.get(key, 0) + 1
        if _hit("INTERRUPT_AT_SAMPLE", key):
            _interrupt_the_close()
        if _hit("STALL_AT_SAMPLE", key):
            import time

            time.sleep(10_000)
        if _hit("BAD_AT_SAMPLE", key):
            from expctl.datasets.images import CorruptImage

            raise CorruptImage(
                f"sample {key} of rank {os.environ.get('RANK', '0')} cannot be decoded"
            )
        g = torch.Generator().manual_seed(key)
        x = torch.randn(self.dim, generator=g) + 0.05 * torch.randn(self.dim)
        return x, int(x[: self.classes].argmax())


def _hit(variable: str, key: int) -> bool:
    spec = os.environ.get(variable, "").split(":")
    if len(spec) < 2 or spec[:2] != [os.environ.get("RANK", "0"), str(key)]:
        return False
    return _Made.reads[key] == int((spec + ["1"])[2])


def _interrupt_the_close() -> None:
    """In a DataLoader worker: once its DataLoader starts shutting the workers down (torch's
    worker loop holds the event it sets), SIGINT to the rank; then stay busy."""
    import sys
    import time

    frame = sys._getframe()
    while frame.f_code.co_name != "_worker_loop":
        frame = frame.f_back  # type: ignore[assignment]
    done = frame.f_locals["done_event"]
    while not done.is_set():
        time.sleep(0.01)
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(10_000)


@register("datasets", "streamed")
def streamed(num_samples: int = 256, val_samples: int = 64, dim: int = 20, num_classes: int = 4):
    """Samples made one by one in `__getitem__` (no TensorDataset): the streamed data path."""
    from expctl import DataInfo, Splits

    return Splits(
        _Made(num_samples, dim, num_classes, 0),
        _Made(val_samples, dim, num_classes, num_samples),
        DataInfo((dim,), num_classes),
    )
