"""The pre-flight checks of the built-in datasets whose modules import torch (synthetic, arrays,
image_folder, imagenet, CIFAR, torchvision's file sources): what `expctl show` and every run
check before anything is read. No torch here: each check is `@light`, so a described entry
(catalogue.py) calls it without importing its dataset's module. A check's defaults are its
factory's, read from the registry (stated once, in the factory's signature)."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expctl import registry
from expctl.builtin.checks import light, owns, split_form
from expctl.builtin.datasets.files import not_found, root_of, root_text
from expctl.errors import UserError

SYNTHETIC_MAX_VALUES = 2**31  # per split, teacher included: 8 GiB of float32
TASKS = ("classification", "regression")
ARRAY_SUFFIXES = (".csv", ".npy", ".npz")
ARRAY_MAX_BYTES = 8 * 2**30  # one file read whole into memory
MAX_IMAGE_SIZE = 8192  # a side of the samples: 3 x 8192^2 float32 is 805 MB an image
PRESETS = ("imagenet", "flip", "center")  # train transform; evaluation is always "center"
IMAGE_NORMALIZE = ("imagenet", "computed", "none")
DECODE = ("auto", "cpu", "gpu", "nvimgcodec")  # gpu: torchvision's nvJPEG

CIFAR = {  # name: (folder, train files, test files, label key, meta file, names key)
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "labels",
        "batches.meta",
        "label_names",
    ),
    "cifar100": (
        "cifar-100-python",
        ["train"],
        ["test"],
        "fine_labels",
        "meta",
        "fine_label_names",
    ),
}


def _args(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """`given`, with the defaults of dataset `name`'s factory for what it leaves out."""
    params = registry.get("datasets", name).parameters()
    return {k: given.get(k, p.default) for k, p in params.items()}


@light
def synthetic(**given: Any) -> None:
    """data=synthetic: a task it knows, sizes >= 1, and a split that fits in memory."""
    a = _args("synthetic", given)
    task, shape = a["task"], a["shape"]
    num_samples, val_samples, num_classes = a["num_samples"], a["val_samples"], a["num_classes"]
    if task not in TASKS:
        raise UserError(f"data.task: '{task}' is not one of: {', '.join(TASKS)}", "set data.task")
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
    most = max(num_samples, val_samples, num_classes)
    if most * math.prod(shape) > SYNTHETIC_MAX_VALUES:
        raise UserError(
            f"data=synthetic: {most} x {list(shape)} is more than {SYNTHETIC_MAX_VALUES:,} "
            "values, the limit of one synthetic split",
            "use smaller data.shape or fewer data.num_samples / data.num_classes",
        )


def array_file(key: str, value: str) -> Path:
    """data.<key>'s file of data=arrays: a .csv, .npy or .npz file that exists and fits."""
    path = Path(value).expanduser()
    if path.suffix.lower() not in ARRAY_SUFFIXES:
        raise UserError(
            f"data.{key}: {value} is not a .csv, .npy or .npz file", "convert it to one of them"
        )
    if not path.is_file():
        raise UserError(
            f"data.{key}: {value} does not exist",
            "check the path (relative to the current directory)",
        )
    if path.stat().st_size > ARRAY_MAX_BYTES:
        raise UserError(
            f"data.{key}: {value} is larger than {ARRAY_MAX_BYTES >> 30} GiB",
            "stream it with a dataset plugin",
        )
    return path


@light
def arrays(**given: Any) -> None:
    """data=arrays: a task it knows, and its files there."""
    a = _args("arrays", given)
    if a["task"] not in TASKS:
        raise UserError(
            f"data.task: '{a['task']}' is not one of: {', '.join(TASKS)}", "set data.task"
        )
    for key in ("train", "val", "test"):
        if a[key]:
            array_file(key, a[key])


def check_choices(**values: tuple[Any, Sequence[Any]]) -> None:
    """data.KEY is one of its choices: ``check_choices(preset=(value, PRESETS))``."""
    for key, (value, choices) in values.items():
        if value not in choices:
            raise UserError(
                f"data.{key}: '{value}' is not one of: {', '.join(map(str, choices))}",
                f"set data.{key} to one of them",
            )


def image_options(a: dict[str, Any]) -> None:
    """What image_folder and imagenet share (`images.ImageOptions`), checked before any file is
    read: the choices, the image size and the form of val_split."""
    check_choices(
        preset=(a["preset"], PRESETS),
        normalize=(a["normalize"], IMAGE_NORMALIZE),
        decode=(a["decode"], DECODE),
        on_corrupt=(a["on_corrupt"], ("error", "skip")),
        channels=(a["channels"], (1, 3)),
    )
    image_size(a["image_size"])
    split_form(a["val_split"])
    normalization(a["mean"], a["std"], a["channels"])
    if a["decode"] == "nvimgcodec" and not nvimgcodec_found():
        raise UserError(
            "data.decode=nvimgcodec: the package nvidia-nvimgcodec is not installed",
            "on a machine with an NVIDIA GPU: pip install 'expctl[gpu-decode]'; "
            "else data.decode=auto",
        )


def normalization(mean: Any, std: Any, channels: int) -> None:
    """data.mean and data.std (both or neither): one number per image channel each, std > 0."""
    if mean is None and std is None:
        return
    example = (
        "data.mean=[0.485,0.456,0.406] data.std=[0.229,0.224,0.225] (ImageNet's)"
        if channels == 3
        else "data.mean=[0.449] data.std=[0.226]"
    )
    for key, value in (("mean", mean), ("std", std)):
        if value is not None and not isinstance(value, (list, tuple)):
            raise UserError(
                f"data.{key}={value!r}: a list of one value per channel, {channels} of them "
                f"(data.channels={channels})",
                f"e.g. {example}",
            )
    if mean is None or std is None or len(mean) != channels or len(std) != channels:
        raise UserError(
            f"data.mean / data.std: give both, {channels} value(s) each, one per channel "
            f"(got {mean}, {std})",
            f"e.g. {example}",
        )
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (*mean, *std)):
        raise UserError(
            f"data.mean / data.std: numbers, {channels} each (got {list(mean)}, {list(std)})",
            f"e.g. {example}",
        )
    if not all(s > 0 for s in std):
        raise UserError(f"data.std={list(std)}: every value must be > 0", f"e.g. {example}")


def nvimgcodec_found() -> bool:
    """Whether nvImageCodec is installed (found, not imported: no CUDA library loads here)."""
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:  # no `nvidia` package at all
        return False


def image_size(size: int) -> None:
    """data.image_size: what a model can take, and a batch of it fits in memory."""
    if not 8 <= size <= MAX_IMAGE_SIZE:
        raise UserError(
            f"data.image_size={size}: images are resized to image_size x image_size "
            f"pixels, from 8 to {MAX_IMAGE_SIZE}",
            "e.g. data.image_size=224",
        )


@light
@owns("mean", "std")
def imagenet(**given: Any) -> None:
    """data=imagenet: its options, and the files torchvision's ImageNet reads (train/, val/,
    and meta.bin or the devkit archive it makes meta.bin from)."""
    a = _args("imagenet", given)
    image_options(a)
    imagenet_files(a["root"])


IMAGENET_EXPECTED = "train/ and val/ class folders and ILSVRC2012_devkit_t12.tar.gz or meta.bin"


def imagenet_files(root: str | None) -> None:
    """ROOT holds what torchvision's ImageNet reads; with only the devkit archive, scipy (which
    torchvision needs to make meta.bin from it, once) is installed."""
    base = root_of(root)
    missing = [d for d in ("train", "val") if not (base / d).is_dir()]
    meta, devkit = base / "meta.bin", base / "ILSVRC2012_devkit_t12.tar.gz"
    if not meta.is_file() and not devkit.is_file():
        missing.append("meta.bin or ILSVRC2012_devkit_t12.tar.gz")
    if missing:
        raise not_found(
            "imagenet",
            root_text(root),
            f"{IMAGENET_EXPECTED}; missing: {', '.join(missing)}",
            download=False,
        )
    if not meta.is_file() and importlib.util.find_spec("scipy") is None:
        raise UserError(
            f"data=imagenet: {devkit.name} is there but not meta.bin, which torchvision makes "
            "from it with scipy, not installed",
            "pip install scipy (needed once: meta.bin is kept beside it)",
        )


@light
@owns("mean", "std")
def image_folder(**given: Any) -> None:
    """data=image_folder: its options, and its folders there (no image is read yet)."""
    a = _args("image_folder", given)
    image_options(a)
    image_folders(a["root"], a["train"], a["val"], a["test"], a["val_split"])


def image_folders(
    root: str | None, train: str, val: str | None, test: str | None, val_split: int | float
) -> tuple[Path, Path | None, Path | None]:
    """The train/val/test folders: ROOT/<train>, ROOT/<val>, ROOT/<test> when ROOT/<train>
    exists, else ROOT itself is one class-per-folder tree (validated by `val_split`)."""
    base = root_of(root)
    if not base.is_dir():
        what = "does not exist" if not base.exists() else "is not a folder"
        raise UserError(
            f"data.root: {root_text(root)} {what}",
            "point data.root at your image folder, e.g. data.root=/path/to/images (a relative "
            "path is from the current directory)",
        )
    subs = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not subs:
        raise UserError(
            f"data.root: {base} holds no class folders",
            "lay images out as ROOT/CLASS/IMAGE.jpg (one sub-folder per class)",
        )
    names = f"{base} holds: {', '.join(subs[:8])}"
    refuse_broken_links(base, [s for s in (train, val, test) if s], "a split folder not there")
    if not (base / train).is_dir():
        if {"train", "val", "valid", "test", val} & set(subs):
            raise UserError(
                f"data.train: no folder {base / train} ({names})", "set data.train to one of them"
            )
        if not val_split and val is not None:
            raise UserError(
                f"data.root: {base} is one folder of classes (no {train}/ and {val}/ inside): "
                "what validates?",
                "set data.val_split (e.g. 0.1) to hold part of it out, or data.val=null for none",
            )
        if test not in (None, "test"):  # asked for by name: it is not there
            raise UserError(
                f"data.test={test}: {base} is one folder of classes (no {train}/ inside), so it "
                "has no test folder",
                f"lay it out as ROOT/{train}/CLASS and ROOT/{test}/CLASS, or data.test=null",
            )
        return base, None, None
    if val is not None and not (base / val).is_dir() and not val_split:
        raise UserError(
            f"data.val: no folder {base / val} ({names})",
            "set data.val to one of them, data.val_split=0.1 to hold part of train out, "
            "or data.val=null for no validation",
        )
    if test not in (None, "test") and not (base / test).is_dir():  # "test": only if it is there
        raise UserError(
            f"data.test: no folder {base / test} ({names})",
            "set data.test to one of them, or data.test=null for no test set",
        )
    pick = [base / s if s and (base / s).is_dir() else None for s in (val, test)]
    return base / train, pick[0], pick[1]


def refuse_broken_links(folder: Path, names: Sequence[str] | None, why: str) -> None:
    """No entry of `folder` (of `names`; None: any not hidden) is a symbolic link to nothing: a
    folder scan would pass over it, and a class left out changes the labels of the others.

    Raises:
        UserError: naming the first broken link and where it points.
    """
    entries = [folder / n for n in names] if names is not None else sorted(folder.iterdir())
    broken = [p for p in entries if p.is_symlink() and not p.exists()]
    if names is None:
        broken = [p for p in broken if not p.name.startswith(".")]
    if broken:
        raise broken_links(broken, why)


def broken_links(broken: Sequence[Path], why: str, hint: str = "") -> UserError:
    """The error naming the first of `broken` (symbolic links to nothing) and where it points."""
    more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
    return UserError(
        f"data.root: {broken[0]} is a broken symbolic link (to {os.readlink(broken[0])})"
        f"{more}: {why}",
        f"restore what it points to (a mounted disk?), or remove the link{hint}",
    )


def cifar_paths(name: str, root: str | None) -> list[Path]:
    folder, train, test, *_ = CIFAR[name]
    return [root_of(root) / folder / f for f in train + test]


def require(name: str, root: str | None, paths: list[Path]) -> None:
    """Every one of `paths` exists, else dataset `name`'s not-found error naming the first
    missing one."""
    missing = [p for p in paths if not p.exists()]
    if missing:
        base = root_of(root)
        shown = ", ".join(str(p.relative_to(base)) for p in paths[:3])
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        raise not_found(
            name, root_text(root), f"{shown}{more}; missing: {missing[0].relative_to(base)}"
        )


@light
def cifar(name: str, root: str | None = None, download: bool = False, **_: Any) -> None:
    """data=cifar10 / cifar100: every file of its folder there, unless it is to be fetched.
    Registered as ``functools.partial(cifar, NAME)``."""
    if not download:
        require(name, root, cifar_paths(name, root))


@light
def source(
    name: str, expected: str, root: str | None = None, download: bool = False, **_: Any
) -> None:
    """One of torchvision's file sources (vision.SOURCES): its top folder or file there
    (torchvision checks the rest). Registered as ``functools.partial(source, NAME, EXPECTED)``;
    the top folder is the first name in `expected`."""
    first = expected.split(" ")[0].split(",")[0].rstrip(",;")
    if not download and not (root_of(root) / first).exists():
        raise not_found(name, root_text(root), expected)
