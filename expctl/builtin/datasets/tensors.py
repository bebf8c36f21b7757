"""What the built-in datasets share: the val split carved from train, normalisation of
in-memory images (where their files are, and the error when they are not: `files`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from expctl.builtin.checks import split_form
from expctl.builtin.data import DataInfo, Splits
from expctl.errors import UserError

NORMALIZE = ("standard", "tanh", "none")  # mean/std of the training images, [-1, 1], [0, 1]


def carve(n: int, val_split: int | float, seed: int = 0) -> tuple[list[int], list[int]]:
    """Indices (train, val) of `n` samples: `val_split` of them (a count, an integer; or a
    fraction, a float below 1: `checks.split_form`) chosen by a fixed random permutation, so
    the split is the same in every run."""
    split_form(val_split)
    count = val_split if isinstance(val_split, int) else round(val_split * n)
    if not 0 < count < n:
        held = "does not split" if isinstance(val_split, int) else f"would hold out {count} of"
        raise UserError(
            f"data.val_split={val_split!r} {held} {n} training samples",
            f"use a count in [1, {n - 1}] or a fraction from {_fractions(n)} (0: no split)",
        )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[count:]), sorted(order[:count])


def _fractions(n: int) -> str:
    """The fractions of `n` samples that hold out at least one and keep at least one, as
    "LOW to HIGH", both strictly inside (`carve` rounds half to even: 0.5 / n itself holds out
    none), each accepted as written."""
    up = 10 ** (1 - math.floor(math.log10(0.5 / n)))  # two significant digits
    digits = math.ceil(math.log10(n)) + 1
    low = (math.floor(0.5 / n * up) + 1) / up
    high = (math.ceil((1 - 0.5 / n) * 10**digits) - 1) / 10**digits
    return f"{low:.2g} to {f'{high:.{digits}f}'.rstrip('0')}"


def with_val(
    train: Dataset[Any],
    test: Dataset[Any] | None,
    info: DataInfo,
    val_split: int | float = 0,
    val: Dataset[Any] | None = None,
    val_view: Dataset[Any] | None = None,
) -> Splits:
    """Splits of a dataset: its own val split when it has one; else `val_split` of train (then
    the test split is scored once, at the end); else the test split validates.

    Args:
        val_view: the training set read as validation data (without augmentation), when it
            differs from `train`.
    """
    if val is not None and not val_split:
        return Splits(train, val, info, test)
    if val_split:
        keep, held = carve(len(train), val_split)  # type: ignore[arg-type]
        return Splits(Subset(train, keep), Subset(val_view or train, held), info, test)
    return Splits(train, test, info, None)


def images_to_float(
    x: torch.Tensor, normalize: str, stats: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """uint8 images (N, C, H, W) as float: standardised per channel with `stats` (mean, std;
    default: those of x itself), scaled to [-1, 1] (tanh) or to [0, 1] (none); and the stats
    used (standard only), for the other splits."""
    if normalize not in NORMALIZE:
        raise UserError(
            f"data.normalize: '{normalize}' is not one of: {', '.join(NORMALIZE)}",
            "standard = mean/std of the training images, tanh = [-1, 1], none = [0, 1]",
        )
    out = x.float().div_(255.0)
    if normalize == "tanh":
        return out.sub_(0.5).div_(0.5), None
    if normalize == "standard":
        if stats is None:  # of the [0, 1] images, before they are standardised in place
            mean = out.mean(dim=(0, 2, 3), keepdim=True)
            stats = mean, out.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        return out.sub_(stats[0]).div_(stats[1]), stats
    return out, None


def in_memory(
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor] | None,
    normalize: str,
    val_split: int | float = 0,
    subset: int | None = None,
    classes: Sequence[str] | None = None,
    num_classes: int | None = None,
) -> Splits:
    """Splits of uint8 images (N, C, H, W) and integer labels, held as float TensorDatasets."""
    x, y = train
    info = DataInfo(
        tuple(x.shape[1:]),
        num_classes or (len(classes) if classes else int(y.max()) + 1),
        tuple(classes) if classes else None,
    )
    train_x, stats = images_to_float(x, normalize)
    sets = [TensorDataset(train_x, y.long())]
    if test is not None:  # standardised with the training images' stats
        sets.append(TensorDataset(images_to_float(test[0], normalize, stats)[0], test[1].long()))
    splits = with_val(sets[0], sets[1] if test is not None else None, info, val_split)
    if not isinstance(splits.train, TensorDataset):  # a carved Subset: back to plain tensors
        splits.train, splits.val = (_tensors(splits.train), _tensors(splits.val))
    if subset is not None:
        n = len(splits.train)
        if not 1 <= subset <= n:
            raise UserError(
                f"data.subset={subset}: keep 1 to {n} training samples", "or data.subset=null: all"
            )
        splits.train = TensorDataset(*(t[:subset] for t in splits.train.tensors))
    return splits


def _tensors(view: Any) -> TensorDataset:
    idx = torch.tensor(view.indices)
    return TensorDataset(*(t[idx] for t in view.dataset.tensors))
