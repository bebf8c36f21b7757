"""Test plugin (listed under `imports:`): steps that die on purpose, to test restarts/resume."""

from __future__ import annotations

import os
import signal

import torch

from expctl import register
from expctl.builtin.steps import Supervised


@register("steps", "kill_driver_after_transplant")
class KillDriverAfterTransplant(Supervised):
    """Supervised, but a local PBT trial that becomes a copy of a better one SIGKILLs its sweep's
    driver (the zygote's parent) once the donor's checkpoint is its own, before the copy is
    recorded: a copy cut short. Only with $KILL_AFTER_TRANSPLANT set."""

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        from expctl.jobs import exploit

        real = exploit.transplant
        if os.environ.get("KILL_AFTER_TRANSPLANT") and not getattr(real, "_kills", False):

            def transplant(run_dir, frozen, ck):  # type: ignore[no-untyped-def]
                step = real(run_dir, frozen, ck)
                with open(f"/proc/{os.getppid()}/stat") as f:  # the zygote's parent: the driver
                    driver = int(f.read().rsplit(")", 1)[1].split()[1])
                os.kill(driver, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
                return step

            transplant._kills = True  # type: ignore[attr-defined]
            exploit.transplant = transplant
        return super().train_step(ctx, batch)


@register("steps", "kill_at_step")
class KillAtStep(Supervised):
    """Supervised, but SIGKILLs this process at its micro-batch $KILL_AT_STEP (counted over the
    process: in a local sweep, across trials) on rank $KILL_RANK, only in the first attempt.
    With $KILL_LOG set, it first appends "rank R step S" there: the test's proof that the kill
    happened (torchrun names only one failure, and a peer that dies of the kill in the same
    poll may be the one it names)."""

    calls = 0

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        KillAtStep.calls += 1
        rank = os.environ.get("RANK", "0")
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        target = int(os.environ.get("KILL_AT_STEP", "-1"))
        if first and rank == os.environ.get("KILL_RANK", "0") and KillAtStep.calls == target:
            if os.environ.get("KILL_LOG"):
                with open(os.environ["KILL_LOG"], "a") as log:
                    log.write(f"rank {rank} step {target}\n")
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


@register("models", "stall_build")
def stall_build(input_shape: tuple[int, ...] = (20,), num_classes: int = 4, seconds: float = 120):
    """`tiny_custom` after `seconds` (a signal's exception ends the wait): a run whose
    ranks are still building when a test signals it."""
    import time

    time.sleep(seconds)
    return tiny_custom(input_shape, num_classes)


@register("models", "tiny_blocks", inferred=("in_channels", "num_classes"))
def tiny_blocks(in_channels: int = 1, num_classes: int = 4, width: int = 8):
    """A conv net with BatchNorm that names its `blocks` (FSDP shards each on its own)."""
    from torch import nn

    class TinyBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(in_channels, width, 3, padding=1)
            self.blocks = nn.ModuleList(
                nn.Sequential(
                    nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()
                )
                for _ in range(2)
            )
            self.head = nn.Sequential(
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)
            )

        def forward(self, x):  # type: ignore[no-untyped-def]
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return TinyBlocks()


@register("steps", "slow")
class Slow(Supervised):
    """Supervised, sleeping $SLOW_STEP_S (default 0.05 s) per step: time to signal a running job;
    twice as long while the learning rate is below $SLOW_LR_BELOW or above $SLOW_LR_ABOVE (a
    trial that falls behind the others of a sweep). A Slurm job requeued at least once sleeps
    $SLOW_STEP_S_REQUEUED instead, where set (the rest of a run cut short by its time limit)."""

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        import time

        delay = float(os.environ.get("SLOW_STEP_S", "0.05"))
        if int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0:
            delay = float(os.environ.get("SLOW_STEP_S_REQUEUED", delay))
        lr = next(iter(ctx.optimizers.values())).param_groups[0]["lr"]
        if lr < float(os.environ.get("SLOW_LR_BELOW", "0")) or lr > float(
            os.environ.get("SLOW_LR_ABOVE", "inf")
        ):
            delay *= 2
        time.sleep(delay)
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


@register("steps", "oom_at_step")
class OomAtStep(Supervised):
    """Supervised, but the micro-batch $OOM_AT_STEP raises torch's out-of-memory error with the
    text the CUDA allocator gives it (the CPU has no such allocator to fill)."""

    calls = 0

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        OomAtStep.calls += 1
        if OomAtStep.calls == int(os.environ.get("OOM_AT_STEP", "0")):
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 192.00 MiB. GPU 0 has a total capacity of "
                "79.19 GiB of which 17.06 MiB is free. Including non-PyTorch memory, this process "
                "has 79.17 GiB memory in use. Of the allocated memory 77.1 GiB is allocated by "
                "PyTorch. See documentation for Memory Management"
            )
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


@register("steps", "stall_checkpoint_write")
class StallCheckpointWrite(Supervised):
    """Supervised, but the checkpoint of step $STALL_AT_STEP stops inside its write, where
    $STALL_WHERE says: `mid` (inside torch.save, its first bytes in the file) or `end` (torch.save
    done, before the file is synced, checksummed and named). It then writes $STALL_MARKER (JSON:
    the temporary file's path and the bytes in it) and sleeps until the test kills it, or for
    $STALL_SECONDS. Nothing stalls without $STALL_AT_STEP."""

    def train_step(self, ctx, batch):  # type: ignore[no-untyped-def]
        _stall_checkpoint_write()
        return super().train_step(ctx, batch)


def _stall_checkpoint_write() -> None:
    import torch

    if getattr(torch.save, "_stalls", False) or "STALL_AT_STEP" not in os.environ:
        return
    real = torch.save
    step, where = int(os.environ["STALL_AT_STEP"]), os.environ.get("STALL_WHERE", "mid")

    def stall(f) -> None:  # type: ignore[no-untyped-def]
        import json
        import time

        f.flush()
        marker = os.environ["STALL_MARKER"]
        with open(marker + ".tmp", "w") as m:
            json.dump({"file": f.name, "bytes": os.fstat(f.fileno()).st_size}, m)
        os.replace(marker + ".tmp", marker)
        end = time.monotonic() + float(os.environ.get("STALL_SECONDS", "inf"))
        while time.monotonic() < end:
            time.sleep(min(3600.0, end - time.monotonic()))

    class Stalling:
        """The checkpoint's file, stalling after the first bytes torch.save writes to it."""

        def __init__(self, f) -> None:  # type: ignore[no-untyped-def]
            self.f, self.stalled = f, False

        def write(self, data) -> int:  # type: ignore[no-untyped-def]
            n = self.f.write(data)
            if not self.stalled:  # once ($STALL_SECONDS: the write then goes on)
                self.stalled = True
                stall(self.f)
            return n

        def flush(self) -> None:
            self.f.flush()

    def save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not (isinstance(obj, dict) and obj.get("step") == step):
            return real(obj, f, *args, **kwargs)
        if where == "mid":
            return real(obj, Stalling(f), *args, **kwargs)
        real(obj, f, *args, **kwargs)
        stall(f)

    save._stalls = True  # type: ignore[attr-defined]
    torch.save = save


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
            from expctl.builtin.datasets.imagefiles import CorruptImage

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
    worker loop holds the event it sets), SIGINT to the rank, or with $INTERRUPT_MARKER, that
    file written (the test then presses Ctrl-C where it should land); then stay busy."""
    import sys
    import time

    frame = sys._getframe()
    while frame.f_code.co_name != "_worker_loop":
        frame = frame.f_back  # type: ignore[assignment]
    done = frame.f_locals["done_event"]
    while not done.is_set():
        time.sleep(0.01)
    marker = os.environ.get("INTERRUPT_MARKER")
    if marker:
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(marker + ".tmp", marker)
    else:
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
