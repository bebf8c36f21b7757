"""Metrics reduced exactly over ranks: `Meter` averages the batch step's train metrics (on the
device, one host sync at log time), `score_split` scores a whole split (sums and counts over
unpadded shards: every sample counted once), and `sync_buffers` makes the ranks' models
identical first, so the metric reported is the saved model's."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from expctl.builtin.steps import derived
from expctl.dist import DistEnv
from expctl.rank.batches import val_batches
from expctl.rank.build import Parts


class Meter:
    """Running sums of the batch step's train metrics on the device; reduced over ranks only at log time."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            v = v.detach().float()
            self.sums[k] = self.sums[k] + v if k in self.sums else v.clone()
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        """The sums since the last reduce, on the CPU: a checkpoint between two train rows
        carries them, so that the next row averages its whole window after a resume."""
        return {"sums": {k: v.cpu() for k, v in self.sums.items()}, "count": self.count}

    def load_state_dict(self, sd: dict[str, Any], device: torch.device) -> None:
        self.sums = {str(k): v.to(device) for k, v in sd["sums"].items()}
        self.count = int(sd["count"])

    def reduce(self, env: DistEnv, prefix: str) -> dict[str, float]:
        """Mean over steps and ranks (one host sync); resets the sums."""
        if not self.sums:
            return {}
        keys = sorted(self.sums)
        vec = torch.stack([self.sums[k] for k in keys]) / self.count
        if env.distributed:
            dist.all_reduce(vec)
            vec /= env.world_size
        self.sums, self.count = {}, 0
        return {f"{prefix}{k}": float(v) for k, v in zip(keys, vec.tolist(), strict=True)}


def sync_buffers(models: dict[str, nn.Module], env: DistEnv) -> None:
    """Give every rank rank 0's buffers (BatchNorm running statistics), as DDP would at the next
    forward: DDP broadcasts them before each forward, then each rank updates its own copy, so
    after a step the ranks would evaluate and save different models. One broadcast per dtype."""
    if not env.distributed:
        return
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for m in models.values():
        for b in m.buffers():
            groups.setdefault((b.dtype, b.device), []).append(b)
    for bufs in groups.values():
        flat = torch.cat([b.detach().reshape(-1) for b in bufs])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for b, v in zip(bufs, flat.split([b.numel() for b in bufs]), strict=True):
                b.copy_(v.view_as(b))


def _evened(
    batches: Iterator[Any], total: int, spare: Callable[[], Any]
) -> Iterator[tuple[Any, bool]]:
    """Each batch and whether it counts: this rank's batches, then as many uncounted ones as it
    takes to reach `total` (its last again, or `spare()` when it has none), so that a rank with
    fewer samples calls the model as often as the others (FSDP gathers each block's weights
    from every rank in the forward)."""
    count, last = 0, None
    for batch in batches:
        count, last = count + 1, batch
        yield batch, True
    for _ in range(total - count):
        last = spare() if last is None else last
        yield last, False


def score_split(
    parts: Parts, env: DistEnv, split: str = "val", limit: int | None = None
) -> dict[str, float]:
    """Metrics over a whole split (val, test or train), reduced exactly (sums and counts) over
    ranks; with `limit`, over that many batches of each rank's shard."""
    data = getattr(parts.splits, split)
    if data is None or not hasattr(parts.batch_step, "val_step"):
        return {}
    ctx = dataclasses.replace(parts.ctx, models=parts.models)  # unwrapped: no DDP collectives
    sums: dict[str, list[Any]] = {}

    def read(rank: int) -> Iterator[Any]:
        return val_batches(
            data,
            parts.val_batch_size,
            rank,
            env.world_size,
            ctx.device,
            parts.batches.loading,
            parts.reader,
            split,
        )

    batches = read(env.rank)
    counted: Iterator[tuple[Any, bool]] = ((b, True) for b in batches)
    if parts.sharded and env.distributed:  # rank 0 has the most: val_batches deals in turn
        most = math.ceil(math.ceil(len(data) / env.world_size) / parts.val_batch_size)
        counted = _evened(batches, most, lambda: next(read(0)))
    elif env.distributed and env.rank >= len(data) > 0:  # a split smaller than the ranks: this
        # rank has none of it, but its sums must name the metrics the others reduce
        counted = ((b, False) for b in itertools.islice(read(0), 1))
    for m in parts.models.values():
        m.eval()
    with torch.no_grad():
        for batch, counts in itertools.islice(counted, limit):
            scored = parts.batch_step.val_step(ctx, batch)
            for k, (s, n) in scored.items():
                acc = sums.setdefault(k, [0.0, 0.0])
                if counts:
                    acc[0], acc[1] = acc[0] + s.double(), acc[1] + n
    for m in parts.models.values():
        m.train()
    keys = sorted(sums)
    vec = torch.tensor([[float(sums[k][0]), float(sums[k][1])] for k in keys], dtype=torch.float64)
    if env.distributed:
        vec = vec.to(ctx.device)
        dist.all_reduce(vec)
    row = {
        f"{split}/{k}": float(s / n) if n else math.nan
        for k, (s, n) in zip(keys, vec.tolist(), strict=True)
    }
    return derived(parts.batch_step, row)
