"""Cross-rank control: small CPU agreements beside the training collectives.

`Control` broadcasts and gathers Python objects on a gloo group (run directory, RNG states for
checkpoints) and names the ranks that stopped answering; `StopFlag` turns the preemption signal
into a decision every rank takes at the same step.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from expctl.dist import DistEnv


class Control:
    """Small CPU collectives (gloo) that never touch the GPU stream: run-dir agreement, RNG
    gathering for checkpoints."""

    def __init__(self, env: DistEnv, store: Any = None) -> None:
        self.env, self.store = env, store
        self.group: Any = None
        if env.distributed:
            import torch.distributed as dist

            self.group = dist.new_group(backend="gloo")

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.group is None:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def unresponsive(self, step: int, wait_s: float = 3.0) -> list[int]:
        """After a collective timed out: ranks that do not say they are waiting too."""
        if self.store is None:
            return []
        self.store.set(f"waiting/{self.env.rank}", str(step))
        time.sleep(wait_s)  # the other live ranks time out on the same collective
        return [r for r in range(self.env.world_size) if not self.store.check([f"waiting/{r}"])]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if self.group is None:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out


class StopFlag:
    """The preemption signal only sets a flag; ranks agree on it at step boundaries.

    Agreement is a MAX all-reduce of one CPU integer on the gloo control group, started at one
    check (every `EVERY` optimizer steps) and read at the next: it never waits on the GPU, and
    all ranks see the same answer at the same step, so they checkpoint the same step.
    """

    EVERY = 10

    def __init__(self, signame: str, ctl: Control) -> None:
        import signal
        import threading

        self.ctl, self.requested, self._calls, self.signame = ctl, 0, 0, signame
        self.signum = int(getattr(signal, f"SIG{signame}"))
        self.previous: Any = None
        self._buf = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(self.signum, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = 1

    def agreed(self) -> bool:
        """Whether every rank now knows that some rank got the signal (checked every
        `EVERY` steps with several ranks: a CPU all-reduce per step would cost small models ~10%)."""
        if self.ctl.group is None:
            return bool(self.requested)
        self._calls += 1
        if self._calls % self.EVERY:
            return False
        import torch.distributed as dist

        if self._work is not None:
            self._work.wait()
            self._work = None
            if int(self._buf.item()):
                return True
        self._buf.fill_(self.requested)
        self._work = dist.all_reduce(
            self._buf, op=dist.ReduceOp.MAX, group=self.ctl.group, async_op=True
        )
        return False

    def close(self) -> None:
        """Finish the pending agreement and restore the previous handler."""
        import signal

        if self._work is not None:
            self._work.wait()
            self._work = None
        if self.previous is not None:
            signal.signal(self.signum, self.previous)
