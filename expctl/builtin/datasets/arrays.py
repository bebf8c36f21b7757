"""``data=arrays``: features and targets from your own .csv, .npy or .npz files, in memory.

- CSV: one row per sample, a header row optional; the target is the column named (or numbered)
  by ``target``, by default the last; ``features`` picks columns (default: all the others).
  Class labels may be words (sorted, then numbered).
- .npy: one 2-D array, the target in column ``target`` (default: the last).
- .npz: arrays ``x`` and ``y`` (or ``X``/``y``, ``features``/``targets``); a single .npz may hold
  all splits as ``x_train``, ``y_train``, ``x_val``, ``y_val``, ``x_test``, ``y_test``.

Classification targets are integer labels (``num_classes`` = the number of distinct ones);
regression targets are floats (``num_classes`` = the number of target columns, the model's
outputs). Features are standardised with the training split's mean and std (in float64, then
stored as float32) unless ``standardize=false``. A file that cannot be a table of numbers (one
column, no feature column, complex values, an empty target, NaN) is refused, naming it.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets import preflight
from expctl.builtin.datasets.tensors import carve
from expctl.errors import UserError
from expctl.registry import register

NOT_FINITE = ["nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"]
MAX_CLASSES = 1_000_000  # integer labels 0..N-1 make N classes: the model's outputs


def _column(target: str | int | None, header: list[str] | None, width: int, where: Path) -> int:
    if target is None:
        return width - 1
    if isinstance(target, int) or (isinstance(target, str) and target.lstrip("-").isdigit()):
        index = int(target)
        if -width <= index < width:
            return index % width
    elif header and target in header:
        return header.index(target)
    raise UserError(
        f"data.target: no column {target!r} in {where} "
        f"(columns: {', '.join(header) if header else f'0..{width - 1}'})",
        "name a column of the file (or its number); default: the last",
    )


def _read_csv(path: Path, target: str | int | None, features: list[Any] | None) -> Table:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            rows = [r for r in reader if r]
    except (csv.Error, UnicodeDecodeError) as e:  # a field over 128 KiB, bytes not UTF-8
        where = f" line {reader.line_num}" if isinstance(e, csv.Error) else ""
        raise UserError(
            f"data: {path}{where} is not a CSV table ({' '.join(str(e).split())[:120]})",
            "save it as UTF-8 CSV: one row per sample, numbers separated by commas",
        ) from None
    if not rows:
        raise UserError(f"data: {path} is empty", "give a CSV with one row per sample")
    if all(len(r) == 1 for r in rows):  # no comma on any line: a table needs two columns
        sep = next((s for s in ";\t|" if s in rows[0][0]), None)
        raise UserError(
            f"data: {path} has one column (no comma in any row"
            + (f"; {sep!r} separates its values" if sep else "")
            + "): no features besides the target",
            "save it comma-separated (pandas: df.to_csv(path, index=False))",
        )
    header = None
    if not all(_is_number(v) for v in rows[0][:-1]) or (
        len(rows) > 1 and _is_number(rows[1][-1]) and not _is_number(rows[0][-1])
    ):
        header, rows = [h.strip() for h in rows[0]], rows[1:]
        if not rows:
            raise UserError(f"data: {path} has a header but no rows", "add one row per sample")
    width = len(header or rows[0])
    bad = next((i for i, r in enumerate(rows) if len(r) != width), None)
    if bad is not None:
        raise UserError(
            f"data: {path} row {bad + 1 + bool(header)} has {len(rows[bad])} values, not {width}",
            "fix the file",
        )
    y_col = _column(target, header, width, path)
    cols = (
        [_column(c, header, width, path) for c in features]
        if features
        else [c for c in range(width) if c != y_col]
    )
    try:  # float64: a value beyond float32's range is seen as such, not as infinity
        x = np.array([[float(r[c]) for c in cols] for r in rows], dtype=np.float64)
    except ValueError as e:
        raise UserError(
            f"data: {path} has a non-numeric feature value ({e})",
            "features must be numbers; pick columns with data.features",
        ) from None
    names = [f"column {header[c]!r}" if header else f"column {c}" for c in cols]
    y = _targets_of(path, np.array([r[y_col].strip() for r in rows]), first=1 + bool(header))
    return Table(path, _features(path, x), y, names)


@dataclass
class Table:
    """One split as read from `path`: features (float64), targets, the features' names."""

    path: Path
    x: np.ndarray
    y: np.ndarray
    columns: list[str]


def _features(path: Path, x: np.ndarray, name: str = "") -> np.ndarray:
    """The features of a file as float64, or a UserError saying why they are none."""
    what = f"{path}" + (f" ({name})" if name else "")
    if x.dtype.kind == "c":
        raise UserError(
            f"data: {what} holds complex numbers: their imaginary parts would be lost",
            "store the real and imaginary parts as columns of their own",
        )
    if x.dtype.kind not in "biuf":
        raise UserError(
            f"data: {what} holds {x.dtype} values, not numbers", "save the features as numbers"
        )
    if x.ndim < 2 or math.prod(x.shape[1:]) == 0:
        raise UserError(
            f"data: {what} has no feature columns (shape {x.shape}): the model would get no input",
            "save features and target together (numpy.column_stack([x, y])), or x and y in an .npz",
        )
    return x.astype(np.float64)


def _targets_of(path: Path, y: np.ndarray, name: str = "", first: int = 0) -> np.ndarray:
    """A file's targets; a UserError for complex numbers, empty labels, NaN and infinities
    (reported at row `first` + i of a CSV, else at index i)."""
    what = f"{path}" + (f" ({name})" if name else "")
    if y.dtype.kind == "c":
        raise UserError(
            f"data: {what} has complex targets: their imaginary parts would be lost",
            "store the real and imaginary parts as targets of their own (data.task=regression)",
        )
    if y.dtype.kind in "US":
        text = np.char.strip(y.astype(str))
        bad = (text == "") | np.isin(np.char.lower(text), NOT_FINITE)
    elif y.dtype.kind == "f":
        bad = ~np.isfinite(y)
    else:
        return y
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(len(y), -1).any(axis=1))[0])
        shown = y[i].item() if y.ndim == 1 else y[i].tolist()
        raise UserError(
            f"data: {what} has no target at {f'row {i + first}' if first else f'index {i}'} "
            f"({shown!r})",
            "fill it in, or drop the row",
        )
    return y


def _unreadable(path: Path, e: BaseException) -> UserError:
    return UserError(
        f"data: {path} is not a readable NumPy file ({' '.join(str(e).split())[:160]})",
        "save it with numpy.save / numpy.savez",
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _read(
    path: Path,
    target: str | int | None,
    features: list[Any] | None,
    split: str,
    whole: bool = True,
) -> Table | None:
    """Features and targets of one split from `path`: an .npz's x_SPLIT/y_SPLIT, or (`whole`:
    the file is this split's) its x/y; None when the train file (not `whole`) lacks that split."""
    if path.suffix.lower() == ".csv":
        return _read_csv(path, target, features)
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # truncated, not NumPy's
        raise _unreadable(path, e) from None
    if isinstance(loaded, np.ndarray):
        if loaded.ndim != 2:
            raise UserError(
                f"data: {path} holds a {loaded.ndim}-D array",
                "save one 2-D array: a row per sample, the target in one column",
            )
        y_col = _column(target, None, loaded.shape[1], path)
        x = _features(path, np.delete(loaded, y_col, axis=1))
        columns = [f"column {c}" for c in range(loaded.shape[1]) if c != y_col]
        return Table(path, x, _targets_of(path, loaded[:, y_col]), columns)
    keys = set(loaded.files)
    pairs = [(f"x_{split}", f"y_{split}")]
    if whole:
        pairs += [("x", "y"), ("X", "y"), ("features", "targets")]
    for x_key, y_key in pairs:
        if {x_key, y_key} <= keys:
            try:  # an .npz's arrays are read (and their checksums checked) here
                x, y = loaded[x_key], loaded[y_key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
                raise _unreadable(path, e) from None
            x = _features(path, x, x_key)
            columns = [f"{x_key}[:, {c}]" for c in range(x.shape[1])] if x.ndim == 2 else []
            return Table(path, x, _targets_of(path, y, y_key), columns)
    if not whole:
        return None  # the train file holds no such split
    raise UserError(
        f"data: {path} holds arrays {', '.join(sorted(keys)) or '(none)'}",
        "name them x and y (or x_train, y_train, x_val, y_val, x_test, y_test)",
    )


@register("datasets", check=preflight.arrays)
def arrays(
    train: str,
    val: str | None = None,
    test: str | None = None,
    task: str = "classification",
    target: str | int | None = None,
    features: list[str | int] | None = None,
    val_split: int | float = 0,
    standardize: bool = True,
) -> Splits:
    """Your own table: features and targets from .csv, .npy or .npz files (see the module doc)."""
    preflight.arrays(train=train, val=val, test=test, task=task)
    first = preflight.array_file("train", train)
    found: dict[str, Table | None] = {"train": _read(first, target, features, "train")}
    for split, value in (("val", val), ("test", test)):
        found[split] = (
            _read(preflight.array_file(split, value), target, features, split)
            if value
            else (
                _read(first, target, features, split, whole=False)
                if first.suffix == ".npz"
                else None
            )
        )
    tr = found["train"]
    assert tr is not None
    if val_split:  # hold part of train out; the given val (or test) file is then the test set
        keep, held = carve(len(tr.x), val_split)
        found["test"] = found["test"] if found["test"] is not None else found["val"]
        found["val"] = dataclasses.replace(tr, x=tr.x[held], y=tr.y[held])
        found["train"] = tr = dataclasses.replace(tr, x=tr.x[keep], y=tr.y[keep])
    elif found["val"] is None:  # the test file (if any) validates
        found["val"], found["test"] = found["test"], None
    classes, encode = _targets(task, tr.y)
    sets = {k: _tensors(v, encode, standardize, tr.x, k) for k, v in found.items() if v}
    y = sets["train"].tensors[1]
    outputs = len(classes) if classes is not None else (1 if y.dim() == 1 else y.shape[1])
    info = DataInfo(tuple(sets["train"].tensors[0].shape[1:]), outputs, classes)
    return Splits(sets["train"], sets.get("val"), info, sets.get("test"))


def _targets(task: str, y: np.ndarray) -> tuple[tuple[str, ...] | None, Any]:
    """Class names and the encoder of target arrays (None for regression)."""
    if task == "regression":

        def to_float(v: np.ndarray) -> torch.Tensor:
            try:
                out = torch.as_tensor(v.astype(np.float32))
            except ValueError as e:
                raise UserError(
                    f"data: a regression target is not a number ({e})",
                    "or set data.task=classification",
                ) from None
            return out.unsqueeze(1) if out.dim() == 1 else out

        return None, to_float
    if y.ndim != 1:
        raise UserError(
            f"data: classification targets must be one column, got shape {y.shape}",
            "or set data.task=regression",
        )
    values = [str(v) for v in y]
    bad = next((v for v in values if _is_number(v) and not math.isfinite(float(v))), None)
    if bad is not None:  # int() of it raised OverflowError
        raise UserError(
            f"data: class label {bad!r} is not a finite number", "fix or drop those rows"
        )
    numeric = all(_is_number(v) and float(v) == int(float(v)) for v in values)
    names = sorted(set(values), key=lambda v: (float(v) if numeric else 0, v))
    if numeric:
        n = int(max(float(v) for v in values)) + 1
        if min(float(v) for v in values) < 0:
            raise UserError("data: integer class labels must be >= 0", "number classes from 0")
        if n > MAX_CLASSES:
            raise UserError(
                f"data: class label {n - 1} makes {n} classes (labels 0..{n - 1}), more than "
                f"{MAX_CLASSES:,}",
                "number the classes 0..N-1, or set data.task=regression for a numeric target",
            )
        names = [str(i) for i in range(n)]
    index = {v: i for i, v in enumerate(names)}

    def to_labels(v: np.ndarray) -> torch.Tensor:
        key = [str(int(float(s))) if numeric and _is_number(str(s)) else str(s) for s in v]
        unknown = sorted(set(key) - set(index))
        if unknown:
            raise UserError(
                f"data: class label(s) {', '.join(unknown[:5])} do not occur in the training split",
                "give every split the same classes",
            )
        return torch.tensor([index[k] for k in key], dtype=torch.long)

    return tuple(names), to_labels


def _tensors(
    table: Table, encode: Any, standardize: bool, ref: np.ndarray, split: str
) -> TensorDataset:
    x, y = table.x, table.y
    if x.shape[1:] != ref.shape[1:]:
        raise UserError(
            f"data.{split}: features of shape {x.shape[1:]}, the training split has {ref.shape[1:]}",
            "give every split the same columns",
        )
    if len(x) != len(y):
        raise UserError(
            f"data.{split}: {len(x)} feature rows, {len(y)} targets", "give one target per row"
        )
    if not np.isfinite(x).all():
        raise UserError(
            f"data.{split}: {_where(table, ~np.isfinite(x))} holds NaN or infinite values",
            "clean or impute them first",
        )
    if standardize:  # in float64 and per column's largest value: no sum or square overflows
        scale = np.abs(ref).max(axis=0)
        scale = np.where(scale > 0, scale, 1.0)
        mean, std = (ref / scale).mean(axis=0) * scale, (ref / scale).std(axis=0) * scale
        x = (x - mean) / np.where(std > 0, std, 1.0)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    if not np.isfinite(x32).all():
        raise UserError(
            f"data.{split}: {_where(table, ~np.isfinite(x32))} holds values beyond float32's "
            f"range ({np.abs(x[~np.isfinite(x32)]).max():.3g})",
            "scale the column down, or keep data.standardize=true",
        )
    return TensorDataset(torch.as_tensor(x32), encode(y))


def _where(table: Table, bad: np.ndarray) -> str:
    """`FILE, column NAME`: the first feature column where `bad` holds."""
    flat = bad.reshape(len(bad), -1).any(axis=0)
    first = int(np.flatnonzero(flat)[0])
    name = table.columns[first] if first < len(table.columns) else f"feature {first}"
    return f"{table.path}, {name},"
