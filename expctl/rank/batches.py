"""How each rank reads its batches of a dataset's splits (the contract: `expctl.builtin.data`).

Two data paths, chosen by the dataset's type and reported in the run's first log line:
- in memory: a TensorDataset is batched by indexing whole tensors, resident on the GPU when
  ``data.device_resident`` allows it;
- streamed: any other dataset is read by the rank's DataLoader workers (``data.num_workers``,
  ``pin_memory``, ``prefetch_factor``, ``timeout``; one set for all splits, started once: see
  builtin/reader.py) in the order of a DistributedSampler, never whole in memory. Each sample's random
  transforms draw from torch's RNG seeded by (seed, epoch, index), so a run's result does not
  depend on ``num_workers``.
"""

from __future__ import annotations

import copy
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import Dataset, DistributedSampler, TensorDataset

from expctl.builtin.reader import Loading, Reader
from expctl.builtin.reader import hook as _hook
from expctl.errors import UserError

NO_WORKERS = Loading()  # samples read by the rank's own process


def auto_workers(local_world_size: int) -> int:
    """DataLoader workers per rank when data.num_workers is null: the cores this process may use
    shared by the node's ranks, one left to each rank's own process, at most 32."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(32, (cores or 1) // max(1, local_world_size) - 1))


def _to_device(dataset: Dataset[Any], device: torch.device) -> Callable[[Any], tuple[Any, ...]]:
    finish = _hook(dataset, "on_device")
    if finish is not None:
        return lambda batch: tuple(finish(batch, device))
    return lambda batch: tuple(t.to(device, non_blocking=True) for t in batch)


def _groups(indices: Sequence[int], size: int) -> list[Sequence[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def augment(x: torch.Tensor, kind: str, pad: int = 2) -> torch.Tensor:
    """Random horizontal flips (and crops of a `pad`-padded copy), per sample, on x's device."""
    if kind == "none" or x.dim() != 4:
        return x
    n, c, h, w = x.shape
    flip = torch.rand(n, device=x.device) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    if kind == "crop_flip":
        xp = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
        dx = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
        rows = (torch.arange(h, device=x.device)[None, :] + dy[:, None])[:, None, :, None]
        cols = (torch.arange(w, device=x.device)[None, :] + dx[:, None])[:, None, None, :]
        x = xp.gather(2, rows.expand(n, c, h, w + 2 * pad)).gather(3, cols.expand(n, c, h, w))
    return x


class TrainBatches:
    """Per-rank training batches for one epoch, resumable at a batch index.

    Order comes from DistributedSampler (seed + epoch), so it depends only on the seed, the epoch
    and the world size: a resumed run sees exactly the batches the interrupted one would have.
    In-memory datasets are batched by indexing whole tensors (resident on the GPU when asked);
    others are streamed by the rank's `Reader`, whose workers persist for the run.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        device: torch.device,
        loading: Loading = NO_WORKERS,
        resident: bool = False,
        augment: str = "none",
        reader: Reader | None = None,
        training: bool = True,
    ) -> None:
        self.dataset, self.batch_size, self.device, self.augment = (
            dataset,
            batch_size,
            device,
            augment,
        )
        self.loading, self.seed = loading, seed
        n = len(dataset)  # type: ignore[arg-type]
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.steps_per_epoch = (n // world_size) // batch_size
        if self.steps_per_epoch == 0 and training:  # `expctl eval` takes none of them
            raise UserError(
                f"data.batch_size={batch_size} x {world_size} rank(s) is larger than the "
                f"{n} training samples: no full batch per epoch",
                f"lower data.batch_size to at most {max(1, n // world_size)}",
            )
        self.tensors: tuple[torch.Tensor, ...] | None = None
        self.reader: Reader | None = None
        if isinstance(dataset, TensorDataset):
            self.tensors = tuple(t.to(device) if resident else t for t in dataset.tensors)
        else:
            self.reader = reader or Reader({"train": dataset}, loading, seed, rank)
        self._finish = _to_device(dataset, device)
        self._stream: Iterator[tuple[Any, ...]] | None = None
        self._at: tuple[int, int, int, int] | None = None  # the open stream's next batch

    def describe(self) -> str:
        """How batches reach the model, for the run's first log line."""
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.tensors is not None:
            where = self.tensors[0].device
            return f"data {n} samples in memory on {where}" + (
                "" if where == self.device else f", copied per batch to {self.device}"
            )
        extra = _hook(self.dataset, "describe")
        return (
            f"data {n} samples streamed by {self.loading.num_workers} DataLoader worker(s) per "
            f"rank{f' ({extra()})' if extra else ''}"
        )

    def epoch(
        self, epoch: int, start: int = 0, count: int | None = None, through: int | None = None
    ) -> Iterator[tuple[torch.Tensor, ...]]:
        """Yield this rank's batches of `epoch` from the `start`-th (a resumed epoch) to the
        `count`-th (default: all; gradient accumulation may leave the last few out).

        A streamed dataset is read by one pass of the workers through the epochs `epoch` ..
        `through` (default: `epoch` alone): those that follow each other with no validation
        between. Its workers read the next epoch's first batches while this one's last ones
        train, so an epoch's start does not wait for them. Any other call starts a new pass."""
        count = self.steps_per_epoch if count is None else count
        self.sampler.set_epoch(epoch)
        if self.tensors is not None:
            indices = list(iter(self.sampler))[start * self.batch_size : count * self.batch_size]
            batches: Iterator[Any] = _index_batches(
                self.tensors, indices, self.batch_size, self.device
            )
        else:
            through = max(epoch, epoch if through is None else through)
            if self._stream is None or self._at != (epoch, start, count, through):
                self._open(epoch, start, count, through)
            batches = self._take(count - start)
        for batch in batches:
            if self.augment != "none":
                batch = (augment(batch[0], self.augment), *batch[1:])
            yield batch

    def _take(self, n: int) -> Iterator[tuple[Any, ...]]:
        """The open stream's next `n` batches; where it stands is noted before each is handed
        out (the caller may stop after any)."""
        assert self._stream is not None and self._at is not None
        epoch, start, count, through = self._at
        for k in range(start, start + n):
            batch = next(self._stream)
            if k + 1 < count:
                self._at = (epoch, k + 1, count, through)
            else:  # the epoch's last: the stream goes on into the next one, if it reads it
                self._at = (epoch + 1, 0, count, through) if epoch < through else None
            yield batch

    def _open(self, epoch: int, start: int, count: int, through: int) -> None:
        """A new pass of the workers over batches `start`..`count` of `epoch`, then the first
        `count` of each epoch to `through`; finished (copied, decoded) ahead on CUDA."""
        self.close()
        reader = self.reader
        assert reader is not None

        def plan() -> Iterator[tuple[int, list[int]]]:  # drawn as the workers take batches
            for e in range(epoch, through + 1):
                order = copy.copy(self.sampler)  # self.sampler stays at the epoch training
                order.set_epoch(e)
                indices = list(iter(order))
                for k in range(start if e == epoch else 0, count):
                    yield e, indices[k * self.batch_size : (k + 1) * self.batch_size]

        read = reader.stream("train", plan())
        cuda = self.device.type == "cuda"
        self._stream = ahead(read, self._finish, self.device) if cuda else map(self._finish, read)
        self._at = (epoch, start, count, through)

    def close(self) -> None:
        """End the open stream (its feeding thread): at the run's end, or before another."""
        stream, self._stream, self._at = self._stream, None, None
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def ahead(
    batches: Iterator[Any],
    finish: Callable[[Any], tuple[Any, ...]],
    device: torch.device,
    threads: int = 1,
) -> Iterator[tuple[Any, ...]]:
    """`finish` (copy to the device, decode, normalise) applied by `threads` threads to the
    batches ahead of the one training, in order (torch releases the GIL in its kernels, so they
    work while the step runs). On CUDA each thread works on its own stream, and the training
    stream waits for each batch's event before using it."""
    cuda = device.type == "cuda"
    local = threading.local()

    def run(batch: Any) -> tuple[tuple[Any, ...], Any]:
        if not cuda:
            return finish(batch), None
        if not hasattr(local, "stream"):
            torch.cuda.set_device(device)  # a new thread starts on device 0
            # ahead of the step's kernels where both wait for the SMs: the batch is what the
            # next step waits for, and its kernels are few and short
            local.stream = torch.cuda.Stream(device, priority=-1)
        with torch.cuda.stream(local.stream):
            out = finish(batch)
            done = torch.cuda.Event()
            done.record(local.stream)
        return out, done

    def take(future: Future[Any]) -> tuple[Any, ...]:
        out, done = future.result()  # re-raises the thread's error here
        if done is not None:
            main = torch.cuda.current_stream(device)
            main.wait_event(done)
            for t in out:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(main)  # its memory is not reused before the step used it
        return out

    pool = ThreadPoolExecutor(threads, thread_name_prefix="expctl-feed")
    pending: deque[Future[Any]] = deque()
    try:
        for batch in batches:  # read here: a DataLoader's iterator is not thread-safe
            pending.append(pool.submit(run, batch))
            if len(pending) > threads:
                yield take(pending.popleft())
        while pending:
            yield take(pending.popleft())
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)


def _index_batches(
    tensors: Sequence[torch.Tensor], indices: list[int], batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, ...]]:
    idx = torch.tensor(indices, dtype=torch.long)
    if tensors[0].device.type == "cuda":  # pinned and asynchronous: no host sync per epoch
        idx = idx.pin_memory().to(tensors[0].device, non_blocking=True)
    pin = device.type == "cuda" and tensors[0].device.type == "cpu"
    for start in range(0, len(idx) - batch_size + 1, batch_size):
        sel = idx[start : start + batch_size]
        batch = [t.index_select(0, sel) for t in tensors]
        if pin:
            batch = [b.pin_memory() for b in batch]
        yield tuple(b.to(device, non_blocking=True) for b in batch)


def val_batches(
    dataset: Dataset[Any],
    batch_size: int,
    rank: int,
    world_size: int,
    device: torch.device,
    loading: Loading = NO_WORKERS,
    reader: Reader | None = None,
    split: str = "val",
) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's share of a validation or test set, without padding: every sample counted
    once (a streamed set by `reader`'s workers, or workers of its own when it has no `split`)."""
    n = len(dataset)  # type: ignore[arg-type]
    indices = list(range(rank, n, world_size))
    if isinstance(dataset, TensorDataset):
        tensors = dataset.tensors
        idx = torch.tensor(indices, dtype=torch.long, device=tensors[0].device)
        for start in range(0, len(idx), batch_size):
            sel = idx[start : start + batch_size]
            yield tuple(t.index_select(0, sel).to(device, non_blocking=True) for t in tensors)
        return
    if reader is None or split not in reader.names:
        reader = Reader({split: dataset}, loading, 0, rank)
    batches = reader.read(split, -1, _groups(indices, batch_size))
    finish = _to_device(dataset, device)
    # on CUDA as in training: the next batch copied (decoded, cropped) while this one is scored
    yield from ahead(batches, finish, device) if device.type == "cuda" else map(finish, batches)
