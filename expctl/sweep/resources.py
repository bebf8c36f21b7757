"""What a sweep's trials get of this machine: how many run at once, which GPUs and cores each.

Packing is per GPU, as a user means it (Ray Tune's users report the other readings as bugs):
`sweep.gpus_per_trial=0.25` puts four trials on each GPU, never a trial across two GPUs and never
floor(gpus / 0.25) trials spread over GPUs' memory; an integer N gives a trial N whole GPUs (an
N-rank DDP job); a trial that ends frees its share for the next one. Cores are split into
disjoint blocks, one per running trial. Pure: the machine is passed in (`Machine.here()` reads
this one), so packing is tested without GPUs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from expctl.errors import UserError

MIN_SHARE = 0.001  # of a GPU per trial: a thousand trials per GPU
EPS = 1e-9  # 1/0.1 is 10.000000000000002: a share that divides 1 packs exactly


@dataclass(frozen=True)
class Machine:
    """The cores this process may use and the GPUs it sees (CUDA_VISIBLE_DEVICES' names)."""

    cores: tuple[int, ...]
    gpus: tuple[str, ...] = ()

    @staticmethod
    def here(gpu_count: int) -> Machine:
        """This machine: the cores of this process's affinity, `gpu_count` visible GPUs named as
        CUDA_VISIBLE_DEVICES names them (so a trial's own list is a subset of the driver's)."""
        cores = (
            tuple(sorted(os.sched_getaffinity(0)))
            if hasattr(os, "sched_getaffinity")
            else tuple(range(os.cpu_count() or 1))
        )
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = [n.strip() for n in visible.split(",")] if visible is not None else []
        gpus = (
            tuple(names[:gpu_count]) if visible is not None else tuple(map(str, range(gpu_count)))
        )
        return Machine(cores, gpus)


@dataclass(frozen=True)
class Share:
    """What one trial asks for: a fraction of one GPU (0 < gpus < 1), N whole GPUs, or none
    (gpus=0: CPU trials); `cpus` cores."""

    gpus: float
    cpus: int

    @property
    def per_gpu(self) -> int:
        """Trials one GPU holds at once (1 for whole GPUs)."""
        return max(1, math.floor(1 / self.gpus + EPS)) if 0 < self.gpus < 1 else 1

    @property
    def whole(self) -> int:
        """Whole GPUs a trial takes (0 for a fraction or none)."""
        return int(self.gpus) if self.gpus >= 1 else 0

    def describe(self) -> str:
        gpu = (
            f"{self.gpus:g} GPU (up to {self.per_gpu} trials per GPU)"
            if 0 < self.gpus < 1
            else f"{self.whole} GPU(s)"
            if self.gpus
            else "no GPU"
        )
        return f"{gpu}, {self.cpus} core(s)"


@dataclass(frozen=True)
class Plan:
    """How a sweep uses the machine: each trial's share and how many run at once."""

    share: Share
    concurrent: int
    machine: Machine
    capped: str = ""  # why fewer run at once than sweep.max_concurrent asked ("": it did not)

    def describe(self) -> str:
        where = f"{len(self.machine.gpus)} GPU(s), " if self.machine.gpus else ""
        shared = self.concurrent * self.share.cpus > len(self.machine.cores)
        return (
            f"{self.concurrent} trial(s) at a time on {where}{len(self.machine.cores)} core(s): "
            f"{self.share.describe()} each"
            + (" (sharing cores)" if shared else "")
            + (f" ({self.capped})" if self.capped else "")
        )


def plan(
    machine: Machine,
    gpus_per_trial: float | None,
    cpus_per_trial: int | None,
    max_concurrent: int | None,
    trials: int,
    ranks: int = 1,
) -> Plan:
    """The share of each trial and the number that run at once.

    Args:
        gpus_per_trial: null = 1 GPU where there are GPUs, none on a CPU-only machine.
        cpus_per_trial: null = the cores divided evenly between the trials that run at once
            (on a CPU-only machine without max_concurrent: `ranks` cores per trial).
        max_concurrent: null = as many as the resources allow.
        trials: how many the sweep has (no more run at once).
        ranks: processes of one trial on a CPU-only machine (launcher.nproc of a local launch).

    Raises:
        UserError: a share this machine cannot give.
    """
    gpus = gpus_per_trial if gpus_per_trial is not None else (1.0 if machine.gpus else 0.0)
    if gpus > 1 and gpus != int(gpus):
        raise UserError(
            f"sweep.gpus_per_trial={gpus:g}: a trial takes a fraction of one GPU or whole GPUs",
            f"use a fraction such as 0.5, or an integer: sweep.gpus_per_trial={math.ceil(gpus)}",
        )
    if 0 < gpus < MIN_SHARE:  # 1/gpus overflows for the tiniest: no GPU holds that many
        raise UserError(
            f"sweep.gpus_per_trial={gpus:g}: a trial takes at least {MIN_SHARE:g} of a GPU",
            f"use sweep.gpus_per_trial={MIN_SHARE:g} or more (at most "
            f"{round(1 / MIN_SHARE)} trials per GPU)",
        )
    if gpus and not machine.gpus:
        raise UserError(
            f"sweep.gpus_per_trial={gpus:g} but this machine has no GPU visible to expctl",
            "drop sweep.gpus_per_trial (CPU trials), or run the sweep where CUDA sees GPUs",
        )
    if gpus > len(machine.gpus):
        raise UserError(
            f"sweep.gpus_per_trial={gpus:g} but this machine has {len(machine.gpus)} GPU(s)",
            f"use sweep.gpus_per_trial={len(machine.gpus)} or fewer",
        )
    cores = len(machine.cores)
    if cpus_per_trial is not None and cpus_per_trial > cores:
        raise UserError(
            f"sweep.cpus_per_trial={cpus_per_trial} but this process may use {cores} core(s)",
            f"use sweep.cpus_per_trial={cores} or fewer",
        )
    share = Share(gpus, 1)
    by_gpu = (
        len(machine.gpus) * share.per_gpu
        if 0 < gpus < 1
        else len(machine.gpus) // share.whole
        if gpus
        else math.inf
    )
    by_cpu: float = cores // (cpus_per_trial or (1 if gpus else max(1, ranks)))
    if max_concurrent is not None and cpus_per_trial is None:
        by_cpu = math.inf  # asked for: that many at once, sharing cores if they must
    limit = min(by_gpu, by_cpu, max_concurrent or math.inf, max(1, trials))
    concurrent = max(1, int(limit))
    cpus = cpus_per_trial or max(1, cores // concurrent)
    capped = ""
    if max_concurrent is not None and concurrent < min(max_concurrent, trials):
        by = (
            f"sweep.gpus_per_trial={gpus:g} on {len(machine.gpus)} GPU(s)"
            if by_gpu <= by_cpu
            else f"sweep.cpus_per_trial={cpus_per_trial} on {cores} core(s)"
        )
        capped = f"sweep.max_concurrent={max_concurrent}, but {by} fit {concurrent}"
    return Plan(Share(gpus, cpus), concurrent, machine, capped)


@dataclass(frozen=True)
class Slot:
    """What a running trial holds: its GPUs (names) and cores."""

    gpus: tuple[str, ...]
    cores: tuple[int, ...]
    shared: int = 1  # trials its GPU holds at most (1: the GPU is its own)


@dataclass
class Allocator:
    """Hands out slots of a plan and takes them back when trials end."""

    plan: Plan
    _gpu_load: dict[str, int] = field(default_factory=dict)
    _core_load: dict[int, int] = field(default_factory=dict)
    _running: int = 0

    def __post_init__(self) -> None:
        self._gpu_load = dict.fromkeys(self.plan.machine.gpus, 0)
        self._core_load = dict.fromkeys(self.plan.machine.cores, 0)

    def take(self) -> Slot | None:
        """A slot for the next trial, or None until a running one ends."""
        share = self.plan.share
        if self._running >= self.plan.concurrent:
            return None
        gpus: tuple[str, ...] = ()
        if 0 < share.gpus < 1:
            # the least used GPU that has room: with fewer trials than room, each gets a GPU of
            # its own before any two share one (ties: the first, so runs place trials alike)
            room = [g for g, n in self._gpu_load.items() if n < share.per_gpu]
            if not room:
                return None
            gpus = (min(room, key=lambda g: self._gpu_load[g]),)
        elif share.whole:
            idle = [g for g, n in self._gpu_load.items() if n == 0]
            if len(idle) < share.whole:
                return None
            gpus = tuple(idle[: share.whole])
        for g in gpus:
            self._gpu_load[g] += 1
        # the least used cores (idle ones, unless more trials than cores were asked for)
        cores = tuple(
            sorted(sorted(self._core_load, key=lambda c: self._core_load[c])[: share.cpus])
        )
        for c in cores:
            self._core_load[c] += 1
        self._running += 1
        return Slot(gpus, cores, share.per_gpu)

    def give_back(self, slot: Slot) -> None:
        for g in slot.gpus:
            self._gpu_load[g] -= 1
        for c in slot.cores:
            self._core_load[c] -= 1
        self._running -= 1

    @property
    def running(self) -> int:
        return self._running
