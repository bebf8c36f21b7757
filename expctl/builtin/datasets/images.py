"""Image files, streamed: ``image_folder`` (a class-per-subfolder tree of JPEG/PNG/... files) and
``imagenet`` (torchvision's ImageNet layout), read by DataLoader workers.

Each sample's crop box and flip are drawn in the worker (torch's RNG, seeded per sample by the
data path); the pixels are then either decoded there with Pillow, cropped and resized in one
step (``decode=cpu``), or, for JPEGs on CUDA (``decode=gpu``), the worker only reads the file's
bytes and the training process decodes the whole batch with nvJPEG
(``torchvision.io.decode_jpeg(..., device="cuda")``) and crops/resizes there. Batches travel as
uint8; conversion to float and normalisation happen on the training device.
"""

from __future__ import annotations

import io
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets.files import not_found, root_of
from expctl.builtin.datasets.tensors import carve
from expctl.errors import UserError
from expctl.registry import register

log = logging.getLogger("expctl")

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm")
PRESETS = ("imagenet", "flip", "center")  # train transform; evaluation is always "center"
NORMALIZE = ("imagenet", "computed", "none")
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DECODE = ("auto", "cpu", "gpu")
STATS_SAMPLES = 256  # images read for normalize=computed
MAX_IMAGE_SIZE = 8192  # a side of the samples: 3 x 8192^2 float32 is 805 MB an image


class CorruptImage(UserError):
    """An image file that cannot be decoded. Raised in a DataLoader worker, it reaches the
    training process as this class again, with the worker's traceback as its text: the last
    line (our message) is kept."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        if "Traceback" in message and f"{type(self).__name__}: " in message:
            message = message.rsplit(f"{type(self).__name__}: ", 1)[1].strip()
            message, _, hint = message.partition("\n  HINT: ")
        super().__init__(message, hint or "remove or replace the file, or set data.on_corrupt=skip")


# ---------------------------------------------------------------------------------------------
# crop boxes: the transform presets, as boxes in the original image
# ---------------------------------------------------------------------------------------------


def crop_box(
    width: int, height: int, size: int, train: bool, preset: str
) -> tuple[tuple[float, float, float, float], bool]:
    """The region of a width x height image that becomes the size x size sample, and whether
    it is flipped. Training with `imagenet`: a random resized crop (area 8-100 %, aspect 3/4-4/3)
    and a random flip; `flip`: the centre crop, randomly flipped; evaluation and `center`: the
    image resized so that its short side is size/0.875, then its centre size x size."""
    if train and preset == "imagenet":
        flip = bool(torch.rand(()) < 0.5)
        area = width * height
        for _ in range(10):
            target = area * float(torch.empty(()).uniform_(0.08, 1.0))
            ratio = math.exp(float(torch.empty(()).uniform_(math.log(3 / 4), math.log(4 / 3))))
            w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
            if 0 < w <= width and 0 < h <= height:
                left = int(torch.randint(0, width - w + 1, ()))
                top = int(torch.randint(0, height - h + 1, ()))
                return (left, top, left + w, top + h), flip
        return _centre(width, height, 1.0), flip  # fallback: the centre square
    flip = train and preset == "flip" and bool(torch.rand(()) < 0.5)
    return _centre(width, height, 0.875), flip


def _centre(width: int, height: int, fraction: float) -> tuple[float, float, float, float]:
    side = min(width, height) * fraction
    x, y = (width - side) / 2, (height - side) / 2
    return (x, y, x + side, y + side)


def pil_sample(image: Any, size: int, channels: int, train: bool, preset: str) -> torch.Tensor:
    """A Pillow image as a uint8 (channels, size, size) tensor, cropped, resized and flipped.

    A JPEG not yet decoded is decoded at the smallest of 1, 1/2, 1/4, 1/8 scale that still
    gives the crop at least `size` pixels a side (libjpeg's DCT scaling: much faster)."""
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    mode = "RGB" if channels == 3 else "L"
    width, height = image.size
    box, flip = crop_box(width, height, size, train, preset)
    if image.format == "JPEG" and image.mode in ("RGB", "L") and getattr(image, "tile", None):
        bw, bh = max(box[2] - box[0], 1.0), max(box[3] - box[1], 1.0)
        image.draft(mode, (math.ceil(width * size / bw), math.ceil(height * size / bh)))
        sx, sy = image.size[0] / width, image.size[1] / height
        box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
    if image.mode != mode:
        image = image.convert(mode)  # grey, RGBA, CMYK, palette: all fine
    out = pil_to_tensor(image.resize((size, size), Image.Resampling.BILINEAR, box=box))
    return out.flip(-1) if flip else out


class PilTransform:
    """The transform of torchvision datasets that yield Pillow images (picklable for workers)."""

    def __init__(self, size: int, channels: int, train: bool, preset: str) -> None:
        self.size, self.channels, self.train, self.preset = size, channels, train, preset

    def __call__(self, image: Any) -> torch.Tensor:
        return pil_sample(image, self.size, self.channels, self.train, self.preset)


class Normalized:
    """Finishing of uint8 image batches on the training device: float, then (x - mean) / std."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std).view(1, -1, 1, 1) * 255

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        return (x.float() - mean) / std


# ---------------------------------------------------------------------------------------------
# a list of image files as a dataset
# ---------------------------------------------------------------------------------------------


class ImageFiles(Dataset[Any]):
    """Samples (path, label) read as size x size images; see the module docstring."""

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        size: int,
        channels: int,
        train: bool,
        preset: str,
        normalize: Normalized,
        decode: str = "cpu",
        on_corrupt: str = "error",
    ) -> None:
        self.samples, self.size, self.channels = list(samples), size, channels
        self.train, self.preset, self.normalize = train, preset, normalize
        self.decode, self.on_corrupt = decode, on_corrupt

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self) -> str:
        return f"{'JPEG decoded by nvJPEG on the GPU' if self.decode == 'gpu' else 'decoded by Pillow'}"

    def __getitem__(self, index: int) -> Any:
        path, label = self.samples[index]
        try:
            with open(path, "rb") as f:
                data = f.read()
            return (*self._pixels(data), label) + ((path,) if self.decode == "gpu" else ())
        except (OSError, ValueError, SyntaxError) as e:  # what Pillow raises for a bad file
            if self.on_corrupt == "skip":
                log.warning("skipped corrupt image %s (%s)", path, " ".join(str(e).split())[:120])
                return None
            raise CorruptImage(
                f"image {path} cannot be decoded ({' '.join(str(e).split())[:160]})"
            ) from None

    def _pixels(self, data: bytes) -> tuple[Any, ...]:
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:  # not an OSError: a file treated as corrupt
            raise ValueError(str(e)) from None
        if self.decode != "gpu":
            pixels = pil_sample(image, self.size, self.channels, self.train, self.preset)
            image.load()  # (done by now) a truncated file fails in the worker, named
            return (pixels,)
        box, flip = crop_box(image.width, image.height, self.size, self.train, self.preset)
        if data[:2] == b"\xff\xd8" and image.mode in ("RGB", "L"):
            raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return raw, torch.tensor(box, dtype=torch.float32), flip  # decoded by on_device
        from torchvision.transforms.v2.functional import pil_to_tensor  # PNG & co: whole, here

        whole = pil_to_tensor(image.convert("RGB" if self.channels == 3 else "L"))
        return whole, torch.tensor(box, dtype=torch.float32), flip

    def collate(self, samples: list[Any]) -> Any:
        """Stack the samples (skipped corrupt ones dropped); with GPU decoding, a list of
        encoded or decoded images, their crop boxes, flips and labels."""
        kept = [s for s in samples if s is not None]
        if not kept:
            raise CorruptImage(f"all {len(samples)} images of a batch are corrupt")
        if self.decode != "gpu":
            return default_collate(kept)
        images, boxes, flips, labels, paths = zip(*kept, strict=True)
        return list(images), torch.stack(boxes), torch.tensor(flips), torch.tensor(labels), paths

    def on_device(self, batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.decode != "gpu":
            x, y = batch
            return self.normalize(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
        images, boxes, flips, labels, paths = batch
        encoded = [i for i, img in enumerate(images) if img.dim() == 1]
        decoded = self._decode([images[i] for i in encoded], [paths[i] for i in encoded], device)
        full: list[torch.Tensor | None] = list(images)
        for i, img in zip(encoded, decoded, strict=True):
            full[i] = img
        keep = [i for i, img in enumerate(full) if img is not None]
        if not keep:
            raise CorruptImage(f"all {len(full)} images of a batch are corrupt")
        x = self._crop_resize([full[i] for i in keep], boxes[keep], flips[keep], device)  # type: ignore[misc]
        return self.normalize(x), labels[keep].to(device, non_blocking=True)

    @property
    def pin_memory(self) -> bool:
        """Whether batches are worth pinning: not a list of encoded files."""
        return self.decode != "gpu"

    def _decode(
        self, data: list[torch.Tensor], paths: Sequence[str], device: torch.device
    ) -> list[torch.Tensor | None]:
        """nvJPEG decoding of a batch; when it fails, image by image, to name the bad file
        (or skip it: None)."""
        if not data:
            return []
        from torchvision.io import ImageReadMode, decode_jpeg

        mode = ImageReadMode.RGB if self.channels == 3 else ImageReadMode.GRAY
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)  # torchcodec
        try:
            return list(decode_jpeg(data, mode=mode, device=device))
        except RuntimeError:
            pass
        out: list[torch.Tensor | None] = []
        for raw, path in zip(data, paths, strict=True):
            try:
                out.append(decode_jpeg(raw, mode=mode, device=device))
            except RuntimeError as e:
                if self.on_corrupt != "skip":
                    raise CorruptImage(
                        f"image {path} cannot be decoded ({' '.join(str(e).split())[:160]})"
                    ) from None
                log.warning("skipped corrupt image %s", path)
                out.append(None)
        return out

    def _crop_resize(
        self,
        images: list[torch.Tensor],
        boxes: torch.Tensor,
        flips: torch.Tensor,
        device: torch.device,
    ) -> torch.Tensor:
        """Each image's box resized to size x size, all in one call: the images zero-padded into
        one batch, then torchvision's roi_align, whose adaptive sampling (ceil(box / size)
        points a side per output pixel) averages like an antialiasing filter; then the flips."""
        from torchvision.ops import roi_align

        height = max(int(img.shape[1]) for img in images)
        width = max(int(img.shape[2]) for img in images)
        padded = torch.zeros(
            len(images), self.channels, height, width, dtype=torch.uint8, device=device
        )
        for i, img in enumerate(images):
            padded[i, :, : img.shape[1], : img.shape[2]].copy_(img, non_blocking=True)
        index = torch.arange(len(images), dtype=torch.float32)[:, None]
        rois = torch.cat([index, boxes.float()], dim=1).to(device, non_blocking=True)
        size = (self.size, self.size)
        out = roi_align(
            padded.float(), rois, size, spatial_scale=1.0, sampling_ratio=-1, aligned=True
        )
        flip = flips.to(device, non_blocking=True)[:, None, None, None]
        return torch.where(flip, out.flip(-1), out)


# ---------------------------------------------------------------------------------------------
# image_folder and imagenet
# ---------------------------------------------------------------------------------------------


def scan_folder(folder: Path, extensions: Sequence[str]) -> tuple[list[str], list[tuple[str, int]]]:
    """Class names (sorted sub-folders) and (path, label) samples of a class-per-folder tree."""
    if not folder.is_dir():
        raise UserError(
            f"data.root: {folder} is not a folder",
            "point data.root at a folder of class sub-folders (or of train/ and val/ ones)",
        )
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(
            f"data.root: {folder} holds no class folders",
            "lay images out as ROOT/CLASS/IMAGE.jpg (one sub-folder per class)",
        )
    samples, empty = [], []
    for label, name in enumerate(classes):
        files = sorted(
            str(p)
            for p in (folder / name).rglob("*")
            if p.suffix.lower() in extensions and p.is_file()
        )
        if not files:
            empty.append(name)
        samples += [(f, label) for f in files]
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise UserError(
            f"data.root: class folder(s) {shown} in {folder} hold no images "
            f"({', '.join(extensions)})",
            "remove the empty class folders, or add images to them",
        )
    return classes, samples


def check_choices(**values: tuple[Any, Sequence[Any]]) -> None:
    for key, (value, choices) in values.items():
        if value not in choices:
            raise UserError(
                f"data.{key}: '{value}' is not one of: {', '.join(map(str, choices))}",
                f"set data.{key} to one of them",
            )


def _normalizer(
    normalize: str,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    channels: int,
    stats_of: ImageFiles,
) -> Normalized:
    """Normalisation by name (imagenet, none), computed from training images, or mean/std."""
    if mean is not None or std is not None:
        if mean is None or std is None or len(mean) != channels or len(std) != channels:
            raise UserError(
                f"data.mean / data.std: give both, {channels} value(s) each (got {mean}, {std})",
                "e.g. data.mean=[0.5,0.5,0.5] data.std=[0.25,0.25,0.25]",
            )
        if not all(s > 0 for s in std):
            raise UserError(f"data.std={list(std)}: every value must be > 0", "e.g. 0.25")
        return Normalized(mean, std)
    if normalize == "none":
        return Normalized([0.0] * channels, [1.0] * channels)
    if normalize == "imagenet":
        if channels == 1:
            return Normalized([sum(IMAGENET_MEAN) / 3], [sum(IMAGENET_STD) / 3])
        return Normalized(IMAGENET_MEAN, IMAGENET_STD)
    step = max(1, len(stats_of) // STATS_SAMPLES)
    pixels = torch.stack([stats_of[i][0] for i in range(0, len(stats_of), step)]).float() / 255
    mean_c, std_c = pixels.mean(dim=(0, 2, 3)), pixels.std(dim=(0, 2, 3)).clamp_min(1e-3)
    log.info(
        "data.normalize=computed from %d training images: mean %s, std %s",
        len(pixels),
        [round(v, 4) for v in mean_c.tolist()],
        [round(v, 4) for v in std_c.tolist()],
    )
    return Normalized(mean_c.tolist(), std_c.tolist())


def _pick_decode(decode: str, device: Any) -> str:
    """decode=auto: Pillow in the DataLoader workers. Measured on 2 x H200 with 16 and 32 cores
    (bench/RESULTS.md), torchvision's batched nvJPEG decoding (about 1,900 img/s per GPU on
    ~500x375 JPEGs, one or four decoding threads alike) is slower than 15 Pillow workers, so
    auto never picks the GPU; decode=gpu remains for machines with few cores per GPU."""
    if decode != "auto":
        if decode == "gpu" and (device is None or torch.device(device).type != "cuda"):
            raise UserError(
                f"data.decode=gpu needs a CUDA device; this run trains on {device or 'cpu'}",
                "use data.decode=auto or cpu",
            )
        return decode
    return "cpu"


@dataclass(frozen=True)
class ImageOptions:
    """The options image_folder and imagenet share (see image_folder's docstring)."""

    val_split: float
    image_size: int
    preset: str
    channels: int
    normalize: str
    mean: list[float] | None
    std: list[float] | None
    decode: str
    on_corrupt: str
    device: Any


def image_splits(
    train_samples: Sequence[tuple[str, int]],
    val_samples: Sequence[tuple[str, int]] | None,
    test_samples: Sequence[tuple[str, int]] | None,
    classes: Sequence[str],
    o: ImageOptions,
) -> Splits:
    """Splits of image files: with `val_split`, part of train validates and the val files (or
    the test files, when there are some) are the test set."""
    check_choices(
        preset=(o.preset, PRESETS),
        normalize=(o.normalize, NORMALIZE),
        decode=(o.decode, DECODE),
        on_corrupt=(o.on_corrupt, ("error", "skip")),
        channels=(o.channels, (1, 3)),
    )
    check_image_size(o.image_size)
    if o.val_split:
        keep, held = carve(len(train_samples), o.val_split)
        train_samples, val_samples, test_samples = (
            [train_samples[i] for i in keep],
            [train_samples[i] for i in held],
            val_samples if test_samples is None else test_samples,
        )
    decode = _pick_decode(o.decode, o.device)
    size, ch = o.image_size, o.channels

    def files(samples: Sequence[tuple[str, int]], train: bool, norm: Normalized) -> ImageFiles:
        return ImageFiles(samples, size, ch, train, o.preset, norm, decode, o.on_corrupt)

    plain = ImageFiles(train_samples, size, ch, False, o.preset, Normalized([0.0], [1.0]))
    norm = _normalizer(o.normalize, o.mean, o.std, ch, plain)
    info = DataInfo((ch, size, size), len(classes), tuple(classes))
    return Splits(
        files(train_samples, True, norm),
        files(val_samples, False, norm) if val_samples else None,
        info,
        files(test_samples, False, norm) if test_samples else None,
    )


def check_image_size(image_size: int = 224, **_: Any) -> None:
    """data.image_size: what a model can take, and a batch of it fits in memory."""
    if not 8 <= image_size <= MAX_IMAGE_SIZE:
        raise UserError(
            f"data.image_size={image_size}: images are resized to image_size x image_size "
            f"pixels, from 8 to {MAX_IMAGE_SIZE}",
            "e.g. data.image_size=224",
        )


def _folder_check(
    root: str | None = None,
    train: str = "train",
    val: str | None = "val",
    val_split: float = 0,
    image_size: int = 224,
    **_: Any,
) -> None:
    check_image_size(image_size)
    _folders(root, train, val, None, val_split)


def _folders(
    root: str | None, train: str, val: str | None, test: str | None, val_split: float
) -> tuple[Path, Path | None, Path | None]:
    """The train/val/test folders: ROOT/<train>, ROOT/<val>, ROOT/<test> when ROOT/<train>
    exists, else ROOT itself is one class-per-folder tree (validated by `val_split`)."""
    base = root_of(root)
    if not base.is_dir():
        what = "does not exist" if not base.exists() else "is not a folder"
        raise UserError(f"data.root: {base} {what}", "point data.root at your image folder")
    subs = sorted(d.name for d in base.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not subs:
        raise UserError(
            f"data.root: {base} holds no class folders",
            "lay images out as ROOT/CLASS/IMAGE.jpg (one sub-folder per class)",
        )
    names = f"{base} holds: {', '.join(subs[:8])}"
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
        return base, None, None
    if val is not None and not (base / val).is_dir() and not val_split:
        raise UserError(
            f"data.val: no folder {base / val} ({names})",
            "set data.val to one of them, data.val_split=0.1 to hold part of train out, "
            "or data.val=null for no validation",
        )
    pick = [base / s if s and (base / s).is_dir() else None for s in (val, test)]
    return base / train, pick[0], pick[1]


@register("datasets", runtime=("device",), check=_folder_check)
def image_folder(
    root: str | None = None,
    train: str = "train",
    val: str | None = "val",
    test: str | None = "test",
    val_split: float = 0,
    image_size: int = 224,
    preset: str = "imagenet",
    channels: int = 3,
    normalize: str = "imagenet",
    mean: list[float] | None = None,
    std: list[float] | None = None,
    decode: str = "auto",
    on_corrupt: str = "error",
    device: Any = None,
) -> Splits:
    """Your images: ROOT/CLASS/*.jpg (or ROOT/{train,val,test}/CLASS/*.jpg), streamed.

    Sub-folder names are the classes (sorted). Without val/ (or with `val_split`, a count or a
    fraction) part of train/ validates. `preset`: training transform (imagenet = random resized
    crop + flip, flip = centre crop + flip, center = centre crop); evaluation always resizes the
    short side to image_size/0.875 and takes the centre. `channels`: 3 (RGB; grey, RGBA, CMYK and
    palette images are converted) or 1 (grey). `normalize`: imagenet, computed (from 256 training
    images) or none; `mean`/`std` override it. `decode`: auto (= cpu: Pillow in the workers,
    measured faster), cpu, gpu (nvJPEG in the training process).
    `on_corrupt`: error (stop, naming the file) or skip (drop it from its batch, with a warning).
    """
    folders = _folders(root, train, val, test, val_split)
    classes, train_samples = scan_folder(folders[0], EXTENSIONS)
    other: list[list[tuple[str, int]] | None] = []
    for folder in folders[1:]:
        if folder is None:
            other.append(None)
            continue
        names, samples = scan_folder(folder, EXTENSIONS)
        if names != classes:
            raise UserError(
                f"data.root: the classes of {folder} differ from those of {folders[0]} "
                f"({', '.join(sorted(set(names) ^ set(classes))[:5])})",
                "give every split the same class folders",
            )
        other.append(samples)
    opts = ImageOptions(
        val_split, image_size, preset, channels, normalize, mean, std, decode, on_corrupt, device
    )
    return image_splits(train_samples, other[0], other[1], classes, opts)


@register("datasets", runtime=("device",), check=check_image_size)
def imagenet(
    root: str | None = None,
    val_split: float = 0,
    image_size: int = 224,
    preset: str = "imagenet",
    channels: int = 3,
    normalize: str = "imagenet",
    mean: list[float] | None = None,
    std: list[float] | None = None,
    decode: str = "auto",
    on_corrupt: str = "error",
    device: Any = None,
) -> Splits:
    """ImageNet-1k as torchvision lays it out (ROOT/train, ROOT/val, devkit or meta.bin).

    Options as image_folder; with `val_split`, part of train validates and val/ is the test set.
    """
    import torchvision.datasets as tvd

    base = root_of(root)
    try:
        sets = {s: tvd.ImageNet(str(base), split=s) for s in ("train", "val")}
    except (RuntimeError, FileNotFoundError) as e:
        raise not_found(
            "imagenet",
            base,
            "train/ and val/ class folders and ILSVRC2012_devkit_t12.tar.gz or meta.bin; "
            f"torchvision said: {' '.join(str(e).split())[:120]}",
            download=False,
        ) from None
    classes = [names[0] for names in sets["train"].classes]
    opts = ImageOptions(
        val_split, image_size, preset, channels, normalize, mean, std, decode, on_corrupt, device
    )
    return image_splits(sets["train"].samples, sets["val"].samples, None, classes, opts)
