"""A list of image files as a dataset (`ImageFiles`), and how a file becomes a sample: the
transform presets' crop boxes and flips, decoding, normalisation on the training device. Used by
``image_folder`` and ``imagenet`` (`images.py`) and by vision.py's streamed sets (`PilTransform`).

Each sample's crop box and flip are drawn in the worker (torch's RNG, seeded per sample by the
data path); here the pixels are then decoded there with Pillow, cropped and resized in one step
(``decode=cpu``). Batches travel as uint8; conversion to float and normalisation happen on the
training device. Decoding on the GPU (``decode=gpu|nvimgcodec``) is `gpuimages.py`'s subclass.
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from expctl.errors import UserError

log = logging.getLogger("expctl")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class CorruptImage(UserError):
    """An image file that cannot be decoded. Raised in a DataLoader worker, it reaches the
    training process as this class again, with the worker's traceback as its text: the last
    line (our message) is kept."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        if "Traceback" in message and f"{type(self).__name__}: " in message:
            message = message.rsplit(f"{type(self).__name__}: ", 1)[1].strip()
            message, _, hint = message.partition("\n  HINT: ")
        super().__init__(message, hint or "remove or replace the file, or set data.on_corrupt=skip")


_SKIPPED: set[str] = set()  # the corrupt files this process has warned about


def all_corrupt(n: int) -> CorruptImage:
    """The error for a batch whose every image was skipped as corrupt (data.on_corrupt=skip):
    every rank must train on each batch, so it cannot be dropped."""
    return CorruptImage(
        f"every image of a batch ({n}) is corrupt: data.on_corrupt=skip drops corrupt images from "
        "their batch, but a batch needs one to train on or score (train.log names the files)",
        "remove or replace those files; where good images are left, a larger data.batch_size "
        "(data.val_batch_size for validation) mixes them in",
    )


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
    """A Pillow image as a uint8 (channels, size, size) tensor, cropped, resized and flipped."""
    box, flip = crop_box(image.size[0], image.size[1], size, train, preset)
    return pil_crop(image, box, flip, size, channels)


def pil_crop(
    image: Any, box: tuple[float, float, float, float], flip: bool, size: int, channels: int
) -> torch.Tensor:
    """`box` of a Pillow image resized to a uint8 (channels, size, size) tensor, then flipped.

    A JPEG not yet decoded is decoded at the smallest of 1, 1/2, 1/4, 1/8 scale that still
    gives the crop at least `size` pixels a side (libjpeg's DCT scaling: much faster)."""
    # Pillow and torchvision off `expctl show`'s pre-flight check of an image dataset
    from PIL import Image  # noqa: PLC0415
    from torchvision.transforms.v2.functional import pil_to_tensor  # noqa: PLC0415

    mode = "RGB" if channels == 3 else "L"
    width, height = image.size
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
    """Samples (path, label) read as size x size images; see the module docstring.

    Args:
        why: how data.decode came to pick this decoder, for the run's first log line.
    """

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        size: int,
        channels: int,
        train: bool,
        preset: str,
        normalize: Normalized,
        on_corrupt: str = "error",
        why: str = "",
    ) -> None:
        self.samples, self.size, self.channels = list(samples), size, channels
        self.train, self.preset, self.normalize = train, preset, normalize
        self.on_corrupt, self.why = on_corrupt, why

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self) -> str:
        return "decoded by Pillow in the workers" + (f"; {self.why}" if self.why else "")

    def __getitem__(self, index: int) -> Any:
        path, label = self.samples[index]
        try:
            with open(path, "rb") as f:
                data = f.read()
            return self._sample(data, label, path)
        except (OSError, ValueError, SyntaxError) as e:  # what Pillow raises for a bad file
            return self.corrupt(path, e)

    def corrupt(self, path: str, error: Exception) -> None:
        """A file that cannot be decoded: skipped (None, with a warning) or named."""
        said = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", " ".join(str(error).split()))
        if self.on_corrupt == "skip":
            if path not in _SKIPPED:  # once per process, not every epoch
                _SKIPPED.add(path)
                log.warning("skipped corrupt image %s (%s)", path, said[:120])
            return None
        raise CorruptImage(f"image {path} cannot be decoded ({said[:160]})") from None

    def _sample(self, data: bytes, label: int, path: str) -> Any:
        image = self.open(data)
        pixels = pil_sample(image, self.size, self.channels, self.train, self.preset)
        image.load()  # (done by now) a truncated file fails in the worker, named
        return pixels, label

    @staticmethod
    def open(data: bytes) -> Any:
        """A file's bytes as a lazy Pillow image (its header read)."""
        from PIL import Image  # noqa: PLC0415 - Pillow off `expctl show`'s pre-flight check

        try:
            return Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as e:  # not an OSError: a file treated as corrupt
            raise ValueError(str(e)) from None

    def collate(self, samples: list[Any]) -> Any:
        """Stack the samples (skipped corrupt ones dropped)."""
        kept = [s for s in samples if s is not None]
        if not kept:
            raise all_corrupt(len(samples))
        return default_collate(kept)

    def on_device(self, batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        return self.normalize(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
