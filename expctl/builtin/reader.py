"""One rank's DataLoader workers: every streamed split (train, val, test) is read by one set of
worker processes, forked once, while no other thread of the process runs, and kept for the run.

Why once: fork() copies only the calling thread, and a child forked while another thread held a
lock (the queue feeders of persistent workers, a pin-memory or logger thread) can hang in
CPython's after-fork clean-up before it runs a line (DESIGN.md trap 13). A loader per split would
fork its workers at the first validation, while the training workers' feeder threads run; here
`Reader.start` forks them all in `build`, before the loop, its loggers or any queue thread exist.

Passes share the workers: a pass (`read`) that starts while another is unfinished (a validation
within an epoch) takes the workers over; the earlier pass asks again for what it had not yet
received when it goes on (samples are keyed, so a sample read twice is the same sample).
A pass draws its batches lazily, as the workers take them (`prefetch_factor` per worker ahead),
so one pass may run on through several epochs (`stream`): its workers read the next epoch's
first batches while this one's last ones train. A worker that stops answering ends the run after
`data.timeout` seconds, naming the rank.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset, default_collate

from expctl.atomic import deferred_interrupt
from expctl.errors import RunError
from expctl.startup import die_with_parent

_END = object()  # a pass's last batch was received


@dataclass(frozen=True)
class Loading:
    """DataLoader settings of streamed datasets (data.num_workers & co, resolved)."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    timeout: float = 300.0  # seconds a rank waits for a batch from its workers


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The RNG seed of one sample's random transforms in one epoch."""
    return ((seed * 1_000_003 + epoch) * 1_000_000_007 + index) % (2**63)


def hook(dataset: Any, name: str) -> Callable[..., Any] | None:
    """A dataset's optional `collate` / `on_device`, looked up through Subset views."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return getattr(dataset, name, None)


class _Keyed(Dataset[Any]):
    """Reads key (split, epoch, i): sample i of that split with torch's RNG seeded for it."""

    def __init__(self, datasets: Sequence[Dataset[Any]], seeds: Sequence[int]) -> None:
        self.datasets, self.seeds = tuple(datasets), tuple(seeds)

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)  # type: ignore[misc, arg-type]

    def __getitem__(self, key: tuple[int, int, int]) -> tuple[int, Any]:
        split, epoch, index = key
        with torch.random.fork_rng(devices=[]):
            # the CPU generator alone: torch.manual_seed would also queue a CUDA seeding, with
            # its stack formatted, for every sample (~10% of a JPEG worker's time)
            torch.default_generator.manual_seed(sample_seed(self.seeds[split], epoch, index))
            return split, self.datasets[split][index]


class _Collate:
    """Joins a batch's samples with its split's `collate` (default: stacking)."""

    def __init__(self, datasets: Sequence[Dataset[Any]]) -> None:
        self.collates = tuple(hook(d, "collate") or default_collate for d in datasets)

    def __call__(self, samples: list[tuple[int, Any]]) -> Any:
        return self.collates[samples[0][0]]([s for _, s in samples])


class _Plan(Sampler[list[Any]]):
    """The batches (lists of keys) of the current pass, drawn from `source` as the workers take
    them; those drawn and not yet received by the rank wait in `sent`."""

    def __init__(self) -> None:
        self.source: Iterator[list[Any]] = iter(())
        self.sent: deque[list[Any]] = deque()

    def __iter__(self) -> Iterator[list[Any]]:
        return self._draw(self.source, self.sent)  # bound now: the next pass sets its own

    @staticmethod
    def _draw(source: Iterator[list[Any]], sent: deque[list[Any]]) -> Iterator[list[Any]]:
        for keys in source:
            sent.append(keys)
            yield keys


def _worker_init(worker_id: int) -> None:
    """A worker ends when its rank closes the reader, or with its rank, never on its own:
    SIGTERM (sent to a rank's whole process group, or to every process of a Slurm step) and
    Ctrl-C are for the rank to act on: a worker that died of them would fail the rank (torch's
    SIGCHLD handler) before it saved its checkpoint. A rank killed outright takes its workers
    along (Linux's PR_SET_PDEATHSIG), stuck ones included."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.excepthook = _quiet_when_abandoned(sys.excepthook)
    die_with_parent()


Hook = Callable[[type[BaseException], BaseException, Any], Any]


def _quiet_when_abandoned(hook: Hook) -> Hook:
    """A worker's excepthook that says nothing of a batch its rank no longer takes: a tensor in
    flight when the rank ends the workers (a Ctrl-C, the run's end) fails to reach it in
    multiprocessing's resource_sharer thread, which would print the traceback."""

    def quiet(kind: type[BaseException], error: BaseException, tb: Any) -> Any:
        abandoned = issubclass(kind, (OSError, EOFError)) and any(
            frame.f_code.co_filename.endswith("resource_sharer.py")
            for frame, _ in traceback.walk_tb(tb)
        )
        return None if abandoned else hook(kind, error, tb)

    return quiet


class Reader:
    """The DataLoader workers that read `splits` (name -> streamed dataset) for one rank.

    Args:
        seed: train.seed; the training split's samples draw from (seed, epoch, index), the
            others from (0, -1, index).
        rank: named when the workers stop answering.
    """

    def __init__(self, splits: dict[str, Dataset[Any]], loading: Loading, seed: int, rank: int):
        self.names, self.loading, self.rank = list(splits), loading, rank
        datasets = list(splits.values())
        self._plan = _Plan()
        workers = loading.num_workers
        extra: dict[str, Any] = {}
        if workers:
            extra = {"persistent_workers": True, "prefetch_factor": loading.prefetch_factor}
            extra.update(timeout=loading.timeout, worker_init_fn=_worker_init)
        self.loader: DataLoader[Any] | None = DataLoader(
            _Keyed(datasets, [seed if n == "train" else 0 for n in self.names]),
            batch_sampler=self._plan,
            collate_fn=_Collate(datasets),
            num_workers=workers,
            pin_memory=loading.pin_memory,
            # its workers' base seed is drawn from here, not from torch's global generator,
            # whose state a checkpoint restores (dropout's): a resumed run draws what the
            # uninterrupted one did
            generator=torch.Generator().manual_seed(seed),
            **extra,
        )
        self._passes = _Passes()  # the loader's iterator, and the workers it forked
        self._turn = 0
        # a reader never closed (dropped after an error): its workers ignore SIGTERM, so the
        # interpreter's exit, which sends them that and waits, would wait forever: they end
        # when the reader is collected, or at the exit before multiprocessing waits (_at_exit)
        weakref.finalize(self, self._passes.end, os.getpid()).atexit = False
        _LIVE.add(self._passes)

    def start(self) -> None:
        """Fork the workers now (with an empty pass: no queue thread starts)."""
        if self.loader is not None and self.loader.num_workers and self._passes.it is None:
            self._plan.source = iter(())
            self._iterate()

    def _iterate(self) -> None:
        """A new pass of the loader (its first forks the workers: they are noted)."""
        assert self.loader is not None
        forks = self.loader.num_workers and not self._passes.workers  # persistent after that
        before = set(multiprocessing.active_children()) if forks else None
        self._passes.it = iter(self.loader)  # only `self` holds it: `close` ends the workers
        if before is not None:
            self._passes.workers = [p for p in multiprocessing.active_children() if p not in before]

    def read(self, split: str, epoch: int, batches: Iterable[Sequence[int]]) -> Iterator[Any]:
        """The collated batches of `split` (lists of sample indices) in order; `epoch` keys
        the training split's random transforms."""
        return self.stream(split, ((epoch, b) for b in batches))

    def stream(self, split: str, batches: Iterable[tuple[int, Sequence[int]]]) -> Iterator[Any]:
        """The collated batches of `split`, each given with its epoch (which keys the training
        split's random transforms), in order, in one pass: `batches` is drawn as the workers take
        them, so it may run on through several epochs, each computed when first needed."""
        which = self.names.index(split)
        plan = ([(which, epoch, i) for i in b] for epoch, b in batches)
        unreceived: deque[list[Any]] = deque()
        while True:
            self._turn += 1
            turn = self._turn
            if self.loader is None:
                raise RuntimeError("the reader is closed")
            # what an earlier turn sent to the workers and never received first, then the rest
            self._plan.source = itertools.chain(list(unreceived), plan)
            self._plan.sent = unreceived = deque()
            self._iterate()
            while self._turn == turn:
                batch = self._next(split)
                if batch is _END:
                    return
                unreceived.popleft()
                yield batch

    def _next(self, split: str) -> Any:
        assert self._passes.it is not None
        try:
            return next(self._passes.it)
        except StopIteration:
            return _END
        except RuntimeError as e:
            if not str(e).startswith("DataLoader timed out"):
                raise
        raise RunError(
            f"rank {self.rank}: no {split} batch from its {self.loading.num_workers} DataLoader "
            f"worker(s) in data.timeout={self.loading.timeout:g} s: a worker is stuck in the "
            "dataset's __getitem__ (or collate); raise data.timeout if a batch takes that long"
        ) from None

    def close(self) -> None:
        """End the workers now. A Ctrl-C meanwhile is held until they are gone, then raised:
        in the iterator's __del__ it would be printed as "Exception ignored" and lost."""
        with deferred_interrupt():
            self.loader = None
            self._passes.end(os.getpid())


class _Passes:
    """The reader's DataLoader iterator and its workers, apart from the reader: what ends them
    (`end`) must not hold the reader, or it would never be collected."""

    def __init__(self) -> None:
        self.it: Iterator[Any] | None = None
        self.workers: list[multiprocessing.process.BaseProcess] = []

    def end(self, owner: int) -> None:
        """End the workers: torch's iterator asks them to stop and waits; one stuck in
        __getitem__ ignored that (and SIGTERM): killed. Only their parent (`owner`) can."""
        if os.getpid() != owner:
            return
        self.it = None
        for p in self.workers:
            if p.is_alive():
                p.kill()
                p.join()
        self.workers = []


_LIVE: weakref.WeakSet[_Passes] = weakref.WeakSet()  # the workers of readers not yet collected


def _at_exit() -> None:
    for passes in list(_LIVE):
        passes.end(os.getpid())


# atexit runs the newest first: this before multiprocessing's own (registered when it was
# imported, above), which sends the workers SIGTERM and waits for them
atexit.register(_at_exit)
