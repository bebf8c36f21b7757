"""A diagnostic training step, registered as a user would (`imports: [step_profile]`):
`train.step=profiled` is expctl's `supervised` step, with torch.profiler around calls
PROFILE_FROM .. PROFILE_FROM + PROFILE_STEPS on rank 0 (environment variables, defaults 60 and
20). The table (sorted by self CPU time, as `raw_ddp.py --profile`) and the window's wall time
per step go to stderr; with PROFILE_TRACE=PATH the window's Chrome trace is written there too
(every thread's CUDA calls and every stream's kernels: `bench/trace_gaps.py` reads it). A PATH
with `{rank}` in it profiles every rank, each into its own file. A run with it is a diagnosis,
not a measurement.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from expctl import register
from expctl.builtin.steps import Supervised

FROM = int(os.environ.get("PROFILE_FROM", "60"))
STEPS = int(os.environ.get("PROFILE_STEPS", "20"))
TRACE = os.environ.get("PROFILE_TRACE", "")


@register("steps", "profiled")
class Profiled(Supervised):
    """`supervised`, profiled over a window of calls on rank 0."""

    def __init__(self) -> None:
        self.calls, self.prof, self.t0 = 0, None, 0.0
        self.rank = os.environ.get("RANK", "0")
        self.main = self.rank == "0" or "{rank}" in TRACE

    def train_step(self, ctx: Any, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        if self.main and self.calls == FROM:
            _sync()
            self.prof, self.t0 = torch.profiler.profile(), time.perf_counter()
            self.prof.__enter__()
        if self.main and self.calls == FROM + STEPS and self.prof is not None:
            _sync()
            wall = (time.perf_counter() - self.t0) / STEPS
            self.prof.__exit__(None, None, None)
            if TRACE:
                self.prof.export_chrome_trace(TRACE.replace("{rank}", self.rank))
            table = self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            print(table, file=sys.stderr)
            print(
                f"profiled window: {wall * 1e3:.2f} ms a step (profiler on)",
                file=sys.stderr,
                flush=True,
            )
            self.prof = None
        self.calls += 1
        return super().train_step(ctx, batch)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
