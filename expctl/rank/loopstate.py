"""The training loop's two records: `TrainState`, where training stands (what a checkpoint
keeps of it, `state_dict`), and `Loop`, what the loop talks to besides the built parts (the ranks,
rank 0's outputs, the stop flag, the hooks) with its own clocks (`train.py` runs the loop).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from expctl.dist import DistEnv
from expctl.rank.control import Control, StopFlag
from expctl.rank.hooks import Hooks
from expctl.rank.hparams import HParams
from expctl.rank.metrics import Meter
from expctl.rank.report import Reporter


@dataclass
class TrainState:
    """Where training stands: optimizer steps, epochs done, micro-batches done in the epoch, the
    last validation and train metrics, early stopping's best value and validations without
    improvement, the training time of all attempts up to the last checkpoint, and every rank's
    train-metric sums since the last train row (`Meter.state_dict`, in rank order)."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    val: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    early_best: float | None = None
    early_stall: int = 0
    train_s: float = 0.0
    window: list[dict[str, Any]] = field(default_factory=list)

    @property
    def epoch_number(self) -> int:
        """The epoch of the newest step, counted from 1: what log lines, metrics.jsonl,
        result.json and the tables say (`epoch` counts the epochs completed; a step after
        them belongs to the next)."""
        return self.epoch + (self.batch > 0)

    def where(self) -> str:
        """`step 9, epoch 3, batch 1` (micro-batches done in that epoch), or at an epoch's end
        `step 16, end of epoch 1`: where a checkpoint of this state continues."""
        if self.batch:
            return f"step {self.step}, epoch {self.epoch_number}, batch {self.batch}"
        return f"step {self.step}, end of epoch {self.epoch}"

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch = int(sd["step"]), int(sd["epoch"]), int(sd["batch"])
        self.val, self.train = dict(sd.get("val") or {}), dict(sd.get("train") or {})
        best = sd.get("early_best")
        self.early_best = None if best is None else float(best)
        self.early_stall = int(sd.get("early_stall") or 0)
        self.train_s = float(sd.get("train_s") or 0.0)
        self.window = list(sd.get("window") or [])


@dataclass
class Loop:
    """What the loop talks to besides the parts: the ranks, rank 0's outputs, the stop signal,
    the hooks of the launcher and the sweep, and its own clocks."""

    env: DistEnv
    control: Control
    reporter: Reporter
    stop: StopFlag
    hooks: Hooks
    run_dir: Path
    started: float = field(default_factory=time.perf_counter)
    mark: float = field(default_factory=time.perf_counter)  # throughput since the last log line
    mark_step: int = 0
    saved_at: int = -1  # the step of the newest checkpoint this launch wrote
    validated_at: int = -1  # the step of this launch's newest validation
    base_s: float = 0.0  # training time of earlier attempts
    hparams: HParams = field(default_factory=lambda: HParams([], None))
    meter: Meter = field(default_factory=Meter)  # the train metrics since the last train row
    pausing: bool = False  # inside `paused`

    @contextmanager
    def paused(self, device: torch.device) -> Iterator[None]:
        """Validation or a checkpoint inside: its time is left out of the next train row's
        samples/s (moved out of the window that began at `mark`). The steps queued on the GPU
        before it are waited for first, so their time stays in. Nested uses count once."""
        if self.pausing:
            yield
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.pausing, began = True, time.perf_counter()
        try:
            yield
        finally:
            self.pausing = False
            self.mark += time.perf_counter() - began
