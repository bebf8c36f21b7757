"""Cross-rank control: small CPU agreements beside the training collectives.

`Control` broadcasts and gathers Python objects on a gloo group (run directory, RNG states for
checkpoints) and names the ranks that stopped answering; `StopFlag` turns a stop signal
(launcher.signal, SIGTERM) into a decision every rank takes at the same step.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from expctl.dist import DistEnv


class Control:
    """Small CPU collectives (gloo) that never touch the GPU stream: run-dir agreement, RNG
    gathering for checkpoints."""

    def __init__(self, env: DistEnv, store: Any = None) -> None:
        self.env, self.store = env, store
        self.group: Any = None
        if env.distributed:
            self.group = dist.new_group(backend="gloo")

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.group is None:
            return obj
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

    def first_to_fail(self) -> bool:
        """Whether no other rank said it failed before this one (then it speaks for the run:
        an error every rank meets is printed once, one only rank 1 meets is printed too)."""
        if self.store is None:
            return True
        try:
            return int(self.store.add("failed", 1)) == 1
        except Exception:  # the store went with its host: rank 0 speaks, as before it
            return self.env.is_main

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.env.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out


class StopFlag:
    """The stop signals only set a flag; ranks agree on it at step boundaries.

    Two signals stop a run at a checkpoint: launcher.signal (Slurm's warning before the time
    limit: the job is requeued) and SIGTERM (what spot instances, Kubernetes, and Slurm without
    --signal send before they kill: the run ends, exit 143, and is resumed by hand).

    Agreement is a MAX all-reduce of one CPU integer (the signal's number, 0 for none) on the
    gloo control group, started at one check (every `EVERY` optimizer steps) and read at the
    next: it never waits on the GPU, and all ranks see the same answer at the same step, so they
    checkpoint the same step.
    """

    EVERY = 10

    def __init__(self, signame: str, control: Control) -> None:
        self.control, self.requested, self._calls = control, 0, 0
        self.configured = int(getattr(signal, f"SIG{signame}"))
        self.agreed_signal = 0
        self.previous: dict[int, Any] = {}
        self._buf = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None
        if threading.current_thread() is threading.main_thread():
            for signum in dict.fromkeys((self.configured, int(signal.SIGTERM))):
                self.previous[signum] = signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.requested = max(self.requested, signum)

    @property
    def signame(self) -> str:
        """The name of the signal the ranks agreed on (SIGTERM, SIGUSR2, ...)."""
        return signal.Signals(self.agreed_signal).name

    @property
    def requeue(self) -> bool:
        """Whether it was launcher.signal, which asks for a requeue (else SIGTERM: the end)."""
        return self.agreed_signal == self.configured

    def agreed(self) -> bool:
        """Whether every rank now knows that some rank got a stop signal (checked every
        `EVERY` steps with several ranks: a CPU all-reduce per step would cost small models ~10%)."""
        if self.control.group is None:
            self.agreed_signal = self.requested
            return bool(self.requested)
        self._calls += 1
        if self._calls % self.EVERY:
            return False
        if self._work is not None:
            self._work.wait()
            self._work = None
            self.agreed_signal = int(self._buf.item())
            if self.agreed_signal:
                return True
        self._buf.fill_(self.requested)
        self._work = dist.all_reduce(
            self._buf, op=dist.ReduceOp.MAX, group=self.control.group, async_op=True
        )
        return False

    def close(self) -> None:
        """Finish the pending agreement and restore the previous handlers."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        for signum, handler in self.previous.items():
            if handler is not None:  # None: a handler not set from Python, which stays
                signal.signal(signum, handler)
        self.previous = {}
