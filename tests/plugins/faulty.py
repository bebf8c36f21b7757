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


@register("steps", "fill_disk_at_step")
class FillDiskAtStep(Supervised):
    """Supervised, but at micro-batch $FILL_AT_STEP of this process it fills the filesystem of
    $FILL_DIR (a file `filler` there, written until the disk is full), once: a full disk that
    arrives while a sweep runs."""

    calls = 0

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        FillDiskAtStep.calls += 1
        folder = os.environ.get("FILL_DIR")
        if folder and FillDiskAtStep.calls == int(os.environ.get("FILL_AT_STEP", "-1")):
            filler = os.path.join(folder, "filler")
            if not os.path.exists(filler):
                try:
                    with open(filler, "wb") as f:
                        while True:
                            f.write(b"x" * 4096)
                            f.flush()
                except OSError:
                    pass
        return super().train_step(ctx, batch)


@register("steps", "meet")
class Meet(Supervised):
    """Supervised, but at its first micro-batch each process leaves a file in $MEET_DIR and waits
    (up to 120 s) until $MEET_N processes have: it passes only if that many train at once."""

    met = False

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        import time
        from pathlib import Path

        if not Meet.met:
            folder, n = Path(os.environ["MEET_DIR"]), int(os.environ["MEET_N"])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + 120
            while len(list(folder.iterdir())) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(list(folder.iterdir()))} of {n} met")
                time.sleep(0.05)
            Meet.met = True
        return super().train_step(ctx, batch)
