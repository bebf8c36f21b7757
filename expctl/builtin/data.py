"""The dataset contract: what a dataset factory returns, and its check.

The contract (exported as `expctl.Splits` and `expctl.DataInfo`): a factory registered with
``@expctl.register("datasets")`` returns ``Splits(train, val, info, test=None)``, where train, val
and test are map-style torch Datasets (``__len__``, ``__getitem__(i)`` returning a tuple such as
``(x, y)``) and ``info`` gives the input shape and the number of classes (or regression outputs):
a model factory's ``in_channels`` / ``num_classes`` / ``input_shape`` arguments that the config
leaves out are filled from it. A dataset may also define
``collate(samples) -> batch`` (how DataLoader workers join samples; default: stacking) and
``on_device(batch, device) -> batch`` (work done on the training device: decoding, normalising).

The per-rank batching of these splits: `expctl.rank.batches`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from expctl.builtin.reader import hook as _hook
from expctl.errors import UserError


@dataclass(frozen=True)
class DataInfo:
    """What models need to know about the data."""

    input_shape: tuple[int, ...]  # one sample's input, e.g. (3, 224, 224) or (13,)
    num_classes: int | None = None  # classes, or outputs of a regression
    classes: tuple[str, ...] | None = None  # class names, in label order (when known)


@dataclass
class Splits:
    """Train, validation and (optionally) test sets of one dataset."""

    train: Dataset[Any]
    val: Dataset[Any] | None
    info: DataInfo
    test: Dataset[Any] | None = None  # evaluated once, at the end (test/ metrics)


CONTRACT = (
    "a dataset factory returns expctl.Splits(train=Dataset, val=Dataset or None, "
    "info=expctl.DataInfo(input_shape=(C, H, W), num_classes=K), test=None)"
)


def check_splits(name: str, made: Any) -> Splits:
    """`made` if it keeps the dataset contract, else a one-line UserError naming it."""
    if not isinstance(made, Splits):
        raise UserError(
            f"data={name}: the dataset factory returned {type(made).__name__}, not expctl.Splits",
            CONTRACT,
        )
    if not isinstance(made.info, DataInfo):
        raise UserError(
            f"data={name}: Splits.info is {type(made.info).__name__}, not expctl.DataInfo", CONTRACT
        )
    for split in ("train", "val", "test"):
        ds = getattr(made, split)
        if ds is None and split != "train":
            continue
        if isinstance(ds, (str, bytes, torch.Tensor)) or not (
            hasattr(ds, "__len__") and hasattr(ds, "__getitem__")
        ):
            raise UserError(
                f"data={name}: Splits.{split} is {type(ds).__name__}, not a map-style Dataset "
                "(with __len__ and __getitem__ returning a tuple such as (x, y))",
                CONTRACT,
            )
    if len(made.train) == 0:  # type: ignore[arg-type]
        raise UserError(f"data={name}: the training split is empty", "check data.root")
    first = made.train[0]
    if first is not None and not isinstance(first, (tuple, list)):
        raise UserError(
            f"data={name}: a training sample is {type(first).__name__}, not a tuple such as (x, y)",
            CONTRACT,
        )
    _check_info(name, made, first)
    return made


def _check_info(name: str, made: Splits, first: Any) -> None:
    """DataInfo agrees with the data: a sample's input shape (when it is a tensor), the class
    names' count, and (in memory) the integer labels' range."""
    info = made.info
    x = first[0] if first else None
    later = _hook(made.train, "on_device") is not None  # the device shapes the batch
    if isinstance(x, torch.Tensor) and tuple(x.shape) != tuple(info.input_shape) and not later:
        raise UserError(
            f"data={name}: DataInfo.input_shape is {tuple(info.input_shape)}, but a training "
            f"sample's input has shape {tuple(x.shape)}",
            CONTRACT,
        )
    known = info.classes is not None and info.num_classes is not None
    if known and len(info.classes or ()) != info.num_classes:
        raise UserError(
            f"data={name}: DataInfo.classes names {len(info.classes or ())} classes, num_classes "
            f"is {info.num_classes}",
            CONTRACT,
        )
    for split in ("train", "val", "test"):
        ds = getattr(made, split)
        if isinstance(ds, TensorDataset) and len(ds.tensors) > 1 and info.num_classes:
            y = ds.tensors[1]
            if not y.is_floating_point() and y.numel() and int(y.max()) >= info.num_classes:
                raise UserError(
                    f"data={name}: the {split} split has label {int(y.max())}, but "
                    f"DataInfo.num_classes is {info.num_classes} (labels are 0..num_classes-1)",
                    CONTRACT,
                )


# ---------------------------------------------------------------------------------------------
# how streamed datasets are read
# ---------------------------------------------------------------------------------------------
