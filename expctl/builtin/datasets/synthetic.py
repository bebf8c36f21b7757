"""``data=synthetic``: deterministic random tensors, for shape-only benchmarks and tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.utils.data import TensorDataset

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets import preflight
from expctl.registry import register


@register("datasets", check=preflight.synthetic)
def synthetic(
    task: str = "classification",
    shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    num_samples: int = 4096,
    val_samples: int = 1024,
    noise: float = 0.1,
    seed: int = 0,
) -> Splits:
    """Deterministic random data: labels (or targets) from a fixed random linear teacher."""
    preflight.synthetic(
        task=task,
        shape=shape,
        num_classes=num_classes,
        num_samples=num_samples,
        val_samples=val_samples,
    )
    g = torch.Generator().manual_seed(seed)
    dim = math.prod(int(s) for s in shape)
    teacher = torch.randn(dim, num_classes, generator=g) / dim**0.5
    bias = torch.randn(num_classes, generator=g)

    def make(n: int) -> TensorDataset:
        x = torch.randn(n, *shape, generator=g)
        out = x.reshape(n, dim) @ teacher + bias
        if task == "classification":
            return TensorDataset(x, out.argmax(1))
        return TensorDataset(x, out + noise * torch.randn(n, num_classes, generator=g))

    train, val = make(num_samples), make(val_samples) if val_samples else None
    return Splits(train, val, DataInfo(tuple(int(s) for s in shape), num_classes))
