"""``data=synthetic``: deterministic random tensors, for shape-only benchmarks and tests."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import TensorDataset

from expctl.builtin.data import DataInfo, Splits
from expctl.errors import UserError
from expctl.registry import register

MAX_VALUES = 2**31  # per split, teacher included: 8 GiB of float32


def _check(
    task: str = "classification",
    shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    num_samples: int = 4096,
    val_samples: int = 1024,
    **_: Any,
) -> None:
    if task not in ("classification", "regression"):
        raise UserError(
            f"data.task: '{task}' is not one of: classification, regression", "set data.task"
        )
    if num_samples < 1 or val_samples < 0 or num_classes < 1:
        raise UserError(
            f"data: num_samples and num_classes must be >= 1, val_samples >= 0 (got "
            f"{num_samples}, {num_classes}, {val_samples})",
            "e.g. data.num_samples=4096 data.val_samples=1024 data.num_classes=10",
        )
    if not shape or not all(isinstance(s, int) and s >= 1 for s in shape):
        raise UserError(
            f"data.shape={list(shape)}: one sample's shape needs at least one size, each >= 1",
            "e.g. data.shape=[3,32,32] (images) or data.shape=[20] (features)",
        )
    dim = math.prod(shape)
    if max(num_samples, val_samples, num_classes) * dim > MAX_VALUES:
        raise UserError(
            f"data=synthetic: {max(num_samples, val_samples, num_classes)} x {list(shape)} is "
            f"more than {MAX_VALUES:,} values, the limit of one synthetic split",
            "use smaller data.shape or fewer data.num_samples / data.num_classes",
        )


@register("datasets", check=_check)
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
    _check(task, shape, num_classes, num_samples, val_samples)
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
