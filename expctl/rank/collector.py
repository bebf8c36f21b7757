"""When Python's cycle collector runs while a rank trains: `GarbageCollection`, which the loop
creates and enters (as torchtitan's `GarbageCollection`). How start-up keeps the collector off
torch's imports is another matter: `expctl.startup`."""

from __future__ import annotations

import gc
import os
from types import TracebackType
from typing import ClassVar

FULL_GC = 20  # every FULL_GC-th of the loop's collections is a full one


class GarbageCollection:
    """Python's cycle collector, run by the loop (as torchtitan's `gc_freq`). Left to itself,
    each rank collects when its own allocations say so, and a pause on one rank (70 ms for the
    first collections after the set-up) stalls the others at the next all-reduce: with N ranks,
    the step pays N ranks' pauses (the Fashion CNN on 4 x H200 ran at 0.66x the raw loop).

    So, inside `with`, automatic collection is off, and `after_step(n)` collects the young
    generations every `every` optimizer steps (the first time, the set-up's objects too: a run
    shorter than that pays nothing) and all of them every `FULL_GC` x `every` (what outlived two
    young collections and became garbage later), at the same step on every rank. Processes forked
    meanwhile (DataLoader workers) keep Python's schedule. `every` = 0, or a collector the user
    turned off: left as it is, and the loop collects nothing."""

    owner: ClassVar[GarbageCollection | None] = None  # the one that turned collection off here

    def __init__(self, every: int) -> None:
        self.every = every
        self.active = False  # automatic collection is off because of this object

    def __enter__(self) -> GarbageCollection:
        if self.every and gc.isenabled():
            _hook_forks()
            self.active, GarbageCollection.owner = True, self
            gc.disable()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.active:
            self.active, GarbageCollection.owner = False, None
            gc.enable()

    def after_step(self, step: int) -> None:
        """After optimizer step `step`: collect if it is one of this object's steps (the same
        on every rank)."""
        if self.active and step % self.every == 0:
            gc.collect(2 if step % (FULL_GC * self.every) == 0 else 1)


_HOOKED = False  # the fork hook is registered in this process


def _hook_forks() -> None:
    """Register, once a process first pauses automatic collection (not at import:
    `os.register_at_fork` cannot be undone), the hook that gives forked children theirs back."""
    global _HOOKED
    if not _HOOKED:
        _HOOKED = True
        os.register_at_fork(after_in_child=_in_child)


def _in_child() -> None:
    """A process forked while the loop runs (a DataLoader worker) gets Python's own schedule:
    the loop that collects for its parent does not run in it."""
    owner = GarbageCollection.owner
    if owner is not None:
        owner.active, GarbageCollection.owner = False, None
        gc.enable()
