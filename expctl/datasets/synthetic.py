"""``data=synthetic``: deterministic random tensors, for shape-only benchmarks and tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import TensorDataset

from expctl.data import DataInfo, Splits
from expctl.errors import UserError
from expctl.registry import register


def _check(shape: Sequence[int] = (3, 32, 32), **_: object) -> None:
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise UserError(
            f"data.shape={list(shape)}: each sample needs at least one value in every dimension",
            "e.g. data.shape=[20] (a vector) or data.shape=[3,32,32] (an image)",
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
    if task not in ("classification", "regression"):
        raise UserError(f"data.task: '{task}' is not one of: classification, regression")
    if num_samples < 1 or val_samples < 0 or num_classes < 1:
        raise UserError("data: num_samples and num_classes must be >= 1, val_samples >= 0")
    g = torch.Generator().manual_seed(seed)
    dim = 1
    for s in shape:
        dim *= int(s)
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
