"""Image files, streamed: ``image_folder`` (a class-per-subfolder tree of JPEG/PNG/... files) and
``imagenet`` (torchvision's ImageNet layout), read by DataLoader workers (`imagefiles.py`: how a
file becomes a sample).

Both take the arguments of `ImageOptions`, stated once there with their defaults; each generated
factory (`image_factory`) adds its own after ``root`` and finds its files (`read`).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets import preflight
from expctl.builtin.datasets.files import not_found, root_of, root_text
from expctl.builtin.datasets.folders import EXTENSIONS, scan_folder
from expctl.builtin.datasets.gpuimages import INSTALL, DeviceDecoded, nvimgcodec_missing
from expctl.builtin.datasets.imagefiles import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFiles,
    Normalized,
)
from expctl.builtin.datasets.tensors import carve
from expctl.dist import detect
from expctl.errors import UserError
from expctl.registry import register

log = logging.getLogger("expctl")

STATS_SAMPLES = 256  # images read for normalize=computed


# ---------------------------------------------------------------------------------------------
# image_folder and imagenet
# ---------------------------------------------------------------------------------------------


def _normalizer(
    normalize: str,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    channels: int,
    stats_of: ImageFiles,
) -> Normalized:
    """Normalisation by name (imagenet, none), computed from training images, or mean/std,
    which win (`expctl eval` of a `computed` run on other data passes the logged values): said
    in the log when data.normalize named another."""
    if mean is not None and std is not None:  # checked: `preflight.normalization`
        if normalize != "imagenet":
            log.info("data.mean / data.std normalise (data.normalize=%s is not used)", normalize)
        return Normalized(mean, std)
    if normalize == "none":
        return Normalized([0.0] * channels, [1.0] * channels)
    if normalize == "imagenet":
        if channels == 1:
            return Normalized([sum(IMAGENET_MEAN) / 3], [sum(IMAGENET_STD) / 3])
        return Normalized(IMAGENET_MEAN, IMAGENET_STD)
    return _computed(channels, stats_of)


def _computed(channels: int, stats_of: ImageFiles) -> Normalized:
    """Per-channel mean and std of up to STATS_SAMPLES training images, evenly spaced, summed
    one image at a time (a stack of them at image_size 2048 would be 13 GB); corrupt files
    skipped as data.on_corrupt says."""
    step = max(1, len(stats_of) // STATS_SAMPLES)
    images, pixels = 0, 0
    total = torch.zeros(channels, dtype=torch.float64)
    squares = torch.zeros(channels, dtype=torch.float64)
    for i in range(0, len(stats_of), step):
        sample = stats_of[i]
        if sample is None:  # a corrupt file, skipped
            continue
        x = sample[0].to(torch.float64).flatten(1) / 255  # (channels, height x width)
        total, squares = total + x.sum(1), squares + (x * x).sum(1)
        images, pixels = images + 1, pixels + x.shape[1]
    if not images:
        raise UserError(
            "data.normalize=computed: none of the training images read for it can be decoded",
            "set data.normalize=imagenet (or data.mean/data.std), or replace the corrupt files",
        )
    mean_c = total / pixels
    std_c = (squares / pixels - mean_c**2).clamp_min(0).sqrt().clamp_min(1e-3)
    log.info(
        "data.normalize=computed from %d training images: mean %s, std %s",
        images,
        [round(v, 4) for v in mean_c.tolist()],
        [round(v, 4) for v in std_c.tolist()],
    )
    return Normalized(mean_c.tolist(), std_c.tolist())


PILLOW_CORES_PER_GPU = 32  # decode=auto: Pillow from this many cores per GPU, else nvJPEG


def _pick_decode(decode: str, device: Any) -> tuple[str, str]:
    """The decoder data.decode names, and why, for the run's first line.

    auto: Pillow in the DataLoader workers without CUDA. On CUDA, torchvision's nvJPEG, unless
    this rank has at least PILLOW_CORES_PER_GPU cores: then Pillow (it costs ~5 CPU ms an image:
    ~24 busy cores feed an H200's ResNet-50). Measured (issue 25, bench/gpu_images.py, ResNet-50
    224 bf16 batch 256 on ~500x375 JPEGs, 16 cores per H200, bench/RESULTS.md): nvJPEG
    0.85-0.91x the GPU-resident synthetic rate on one GPU, 0.82x on two, 0.77x on four, 0.80-0.84x
    compiled; Pillow 0.74-0.99x on one GPU depending on the host's cores, 0.93x on two, 0.77x on
    four. Below 32 cores per GPU nvJPEG is the path that does not depend on the host's cores.
    nvImageCodec is used only when asked for: it was not faster, its hardware backend included.

    Raises:
        UserError: gpu or nvimgcodec without a CUDA device; nvimgcodec not importable.
    """
    cuda = device is not None and torch.device(device).type == "cuda"
    if decode == "cpu":
        return "cpu", ""
    if decode != "auto":
        if not cuda:  # first: nvImageCodec is not even imported (it prints about CUDA libraries)
            raise UserError(
                f"data.decode={decode} needs a CUDA device; this run trains on {device or 'cpu'}",
                "use data.decode=auto or cpu",
            )
        if decode == "nvimgcodec" and (missing := nvimgcodec_missing()):
            raise UserError(
                f"data.decode=nvimgcodec: nvImageCodec cannot be imported ({missing})", INSTALL
            )
        return decode, f"data.decode={decode}"
    if not cuda:
        return "cpu", "data.decode=auto: no CUDA device"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_gpu = (cores or 1) // max(1, detect(os.environ).local_world_size)
    if per_gpu >= PILLOW_CORES_PER_GPU:
        return "cpu", f"data.decode=auto: {per_gpu} cores per GPU >= {PILLOW_CORES_PER_GPU}"
    return "gpu", f"data.decode=auto: {per_gpu} cores per GPU < {PILLOW_CORES_PER_GPU}"


@dataclass(frozen=True)
class ImageOptions:
    """The arguments image_folder and imagenet share, with their defaults: stated here once
    (`image_factory` makes each factory's signature of them; see image_folder's docstring)."""

    root: str | None = None
    val_split: int | float = 0
    image_size: int = 224
    preset: str = "imagenet"
    channels: int = 3
    normalize: str = "imagenet"
    mean: list[float] | None = None
    std: list[float] | None = None
    decode: str = "auto"
    on_corrupt: str = "error"
    device: Any = None


_SHARED = inspect.signature(ImageOptions).parameters


def image_splits(
    train_samples: Sequence[tuple[str, int]],
    val_samples: Sequence[tuple[str, int]] | None,
    test_samples: Sequence[tuple[str, int]] | None,
    classes: Sequence[str],
    o: ImageOptions,
) -> Splits:
    """Splits of image files: with `val_split`, part of train validates and the val files (or
    the test files, when there are some) are the test set."""
    preflight.image_options(vars(o))
    if o.val_split:
        keep, held = carve(len(train_samples), o.val_split)
        train_samples, val_samples, test_samples = (
            [train_samples[i] for i in keep],
            [train_samples[i] for i in held],
            val_samples if test_samples is None else test_samples,
        )
    decode, why = _pick_decode(o.decode, o.device)
    size, ch = o.image_size, o.channels

    def files(samples: Sequence[tuple[str, int]], train: bool, norm: Normalized) -> ImageFiles:
        if decode == "cpu":
            return ImageFiles(samples, size, ch, train, o.preset, norm, o.on_corrupt, why)
        return DeviceDecoded(samples, size, ch, train, o.preset, norm, decode, o.on_corrupt, why)

    plain = ImageFiles(
        train_samples, size, ch, False, o.preset, Normalized([0.0], [1.0]), o.on_corrupt
    )
    norm = _normalizer(o.normalize, o.mean, o.std, ch, plain)
    info = DataInfo((ch, size, size), len(classes), tuple(classes))
    return Splits(
        files(train_samples, True, norm),
        files(val_samples, False, norm) if val_samples else None,
        info,
        files(test_samples, False, norm) if test_samples else None,
    )


def _bound(
    signature: inspect.Signature, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[ImageOptions, dict[str, Any]]:
    """A generated factory's arguments, its defaults filled in: the shared ones as
    `ImageOptions`, and the factory's own."""
    bound = signature.bind(*args, **kwargs)  # a TypeError as the signature's own would be
    bound.apply_defaults()
    a = bound.arguments
    return ImageOptions(**{k: a[k] for k in _SHARED}), {k: a[k] for k in a if k not in _SHARED}


def image_factory(name: str, read: Callable[..., Any]) -> Callable[..., Splits]:
    """The registered factory of a dataset of image files: `ImageOptions`' arguments, with the
    dataset's own (those of `read` after the options) after `root`; its docstring is `read`'s.

    Args:
        read: ``read(options, **own)`` -> (train, val, test, classes): the (path, label) samples
            of each split (val, test: None when there are none) and the class names, for
            `image_splits`.
    """
    shared = list(_SHARED.values())
    own = list(inspect.signature(read).parameters.values())[1:]
    signature = inspect.Signature([shared[0], *own, *shared[1:]], return_annotation="Splits")

    def make(*args: Any, **kwargs: Any) -> Splits:
        o, mine = _bound(signature, args, kwargs)
        train, val, test, classes = read(o, **mine)
        return image_splits(train, val, test, classes, o)

    make.__signature__ = signature  # type: ignore[attr-defined]  # what inspect and the registry read
    make.__name__ = make.__qualname__ = name
    make.__module__ = read.__module__
    make.__doc__ = read.__doc__
    return make


Samples = list[tuple[str, int]]


def _folder_samples(
    o: ImageOptions, train: str = "train", val: str | None = "val", test: str | None = "test"
) -> tuple[Samples, Samples | None, Samples | None, list[str]]:
    """Your images: ROOT/CLASS/*.jpg (or ROOT/{train,val,test}/CLASS/*.jpg), streamed.

    Sub-folder names are the classes (sorted). Without val/ (or with `val_split`, a count or a
    fraction) part of train/ validates. `preset`: training transform (imagenet = random resized
    crop + flip, flip = centre crop + flip, center = centre crop); evaluation always resizes the
    short side to image_size/0.875 and takes the centre. `channels`: 3 (RGB; grey, RGBA, CMYK and
    palette images are converted) or 1 (grey). `normalize`: imagenet, computed (from 256 training
    images) or none; `mean`/`std` override it. `decode`: cpu (Pillow in the workers), gpu
    (torchvision's nvJPEG) or nvimgcodec (nvImageCodec, `pip install 'expctl[gpu-decode]'`): the
    JPEGs of a batch decoded together on the training GPU, cropped there; auto picks (on CUDA:
    Pillow with 32 or more cores per GPU, else gpu).
    `on_corrupt`: error (stop, naming the file) or skip (drop it from its batch, with a warning).
    """
    folders = preflight.image_folders(o.root, train, val, test, o.val_split)
    classes, train_samples = scan_folder(folders[0], EXTENSIONS, on_corrupt=o.on_corrupt)
    other: list[Samples | None] = []
    for folder in folders[1:]:
        if folder is None:
            other.append(None)
            continue
        names, samples = scan_folder(folder, EXTENSIONS, True, o.on_corrupt)
        if names != classes:
            raise UserError(
                f"data.root: the classes of {folder} differ from those of {folders[0]} "
                f"({', '.join(sorted(set(names) ^ set(classes))[:5])})",
                "give every split the same class folders",
            )
        other.append(samples)
    return train_samples, other[0], other[1], classes


def _imagenet_samples(o: ImageOptions) -> tuple[Samples, Samples, None, list[str]]:
    """ImageNet-1k as torchvision lays it out (ROOT/train, ROOT/val, devkit or meta.bin).

    Options as image_folder; with `val_split`, part of train validates and val/ is the test set.
    """
    import torchvision.datasets as tvd  # noqa: PLC0415 - off the pre-flight check (0.3 s)

    base = root_of(o.root)
    preflight.imagenet_files(o.root)
    try:
        sets = {s: tvd.ImageNet(str(base), split=s) for s in ("train", "val")}
    except (RuntimeError, FileNotFoundError, ImportError) as e:
        raise not_found(
            "imagenet",
            root_text(o.root),
            f"{preflight.IMAGENET_EXPECTED}; torchvision said: {' '.join(str(e).split())[:120]}",
            download=False,
        ) from None
    classes = [names[0] for names in sets["train"].classes]
    return sets["train"].samples, sets["val"].samples, None, classes


image_folder = register("datasets", runtime=("device",), check=preflight.image_folder)(
    image_factory("image_folder", _folder_samples)
)
imagenet = register("datasets", runtime=("device",), check=preflight.imagenet)(
    image_factory("imagenet", _imagenet_samples)
)
