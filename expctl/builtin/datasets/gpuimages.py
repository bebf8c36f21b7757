"""Image files decoded on the training device (``data.decode=gpu|nvimgcodec``): `DeviceDecoded`.

The DataLoader workers read each file's bytes and draw its crop box and flip (`crop_box`, from
the per-sample seed, as on the CPU path), but decode nothing: a batch reaches the training
process as `Encoded`. There, on `rank/batches.ahead`'s thread and CUDA stream, one call decodes
every JPEG of the batch (`decode`: torchvision's nvJPEG, ``decode_jpeg(list, device=...)``, or
nvImageCodec, whose hardware backend uses the GPU's JPEG engines beside the SMs), then the crops
are resized and flipped together whatever the images' sizes (`gpucrop.crop_resize`: roi_align's
filter as two batched matmuls) and normalised (`finish`), into one channels_last float batch.

Files the device decoder cannot take fall back to Pillow for that sample only, in the same batch:
PNG, WebP & co, CMYK or greyscale JPEGs (for 3 channels) and JPEGs that do not end with their
end-of-image marker (a cut file: Pillow names it, as on the CPU path) are decoded, cropped and
flipped in the worker (`pil_crop`, the CPU path's own function: the same pixels); a JPEG the
device decoder refuses is decoded by Pillow in the training process, and if Pillow cannot either,
it is named (or skipped, ``data.on_corrupt=skip``) as on the CPU path.

Why roi_align's filter: it resizes a crop of any (fractional) box, and with
``sampling_ratio=-1`` it averages ceil(box / size) samples a side per output pixel, an
antialiasing filter; on 500x375 JPEGs it is within ~1 grey level (of 255, mean absolute) of
Pillow's bilinear resize. roi_align itself takes same-sized images only: one call per size
cost real photographs (~100 sizes a batch) hundreds of small kernels and copies a batch. Cropping each image then `interpolate(antialias=True)` matched Pillow
more closely on whole-pixel boxes (0.2) but rounds the fractional centre crop (4.7 off) and costs
four kernels per image (measured on the CPU, `tests/test_data.py` checks the tolerance).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from expctl.builtin.datasets.gpucrop import crop_resize, to_device
from expctl.builtin.datasets.imagefiles import (
    ImageFiles,
    Normalized,
    all_corrupt,
    crop_box,
    pil_crop,
)

log = logging.getLogger("expctl")

DECODERS = {
    "gpu": "torchvision's nvJPEG",
    "nvimgcodec": "nvImageCodec (the JPEG engines where the GPU has them, else CUDA)",
}
INSTALL = "pip install 'expctl[gpu-decode]'"


def nvimgcodec_missing() -> str | None:
    """Why nvImageCodec cannot be imported here, or None when it can."""
    try:
        with _without_codec_noise():
            from nvidia import nvimgcodec  # noqa: F401, PLC0415 - optional, heavy
    except Exception as e:  # ImportError, or OSError for a missing libnvjpeg
        return " ".join(str(e).split())[:160] or type(e).__name__
    return None


_NOISE = re.compile(r"nvjpeg2k|nvJPEG2000|nvtiff|nvTIFF")


@contextmanager
def _without_codec_noise() -> Iterator[None]:
    """nvImageCodec's loader prints three lines to stderr for each optional extension whose
    library is not installed (nvJPEG2000, nvTIFF: JPEG 2000 and TIFF, which expctl does not
    decode on the device) on every import and decoder: those are dropped, anything else it
    (or another thread meanwhile) writes is written back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [
                x
                for x in caught.read().decode(errors="replace").splitlines()
                if not _NOISE.search(x)
            ]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")


@dataclass
class Encoded:
    """A batch as the workers send it: JPEG bytes to decode on the device, the other samples
    already decoded, cropped and flipped by Pillow (`ready`), and every sample's box and flip.

    The JPEG files travel as one tensor (`flat`, the files end to end, and their `lengths`):
    each tensor a worker sends is a shared-memory file the training process opens, and 256 of
    them per batch cost its main thread 173 ms a batch on the 2-core machine (one: 5 ms)."""

    flat: torch.Tensor  # 1-D uint8: the JPEG files' bytes, end to end
    lengths: list[int]  # each file's size in bytes
    encoded_at: list[int]  # their places in the batch
    ready: torch.Tensor | None  # (k, C, size, size) uint8
    ready_at: list[int]
    boxes: torch.Tensor  # (n, 4) float64: left, top, right, bottom in the image's pixels
    flips: torch.Tensor  # (n,) bool
    labels: torch.Tensor
    paths: tuple[str, ...]

    @property
    def encoded(self) -> list[torch.Tensor]:
        """The JPEG files, each a 1-D uint8 view of `flat`."""
        return list(torch.split(self.flat, self.lengths)) if self.lengths else []


_EMPTY = torch.empty(0, dtype=torch.uint8)


class DeviceDecoded(ImageFiles):
    """`ImageFiles` whose JPEGs are decoded in batches on the training device (`decoder`: gpu
    or nvimgcodec); see the module docstring."""

    def __init__(
        self,
        samples: Sequence[tuple[str, int]],
        size: int,
        channels: int,
        train: bool,
        preset: str,
        normalize: Normalized,
        decoder: str = "gpu",
        on_corrupt: str = "error",
        why: str = "",
    ) -> None:
        super().__init__(samples, size, channels, train, preset, normalize, on_corrupt, why)
        self.decoder = decoder

    def describe(self) -> str:
        return (
            f"JPEGs decoded in batches by {DECODERS[self.decoder]} on the training device, "
            "cropped there; other files by Pillow in the workers"
            + (f"; {self.why}" if self.why else "")
        )

    @property
    def pin_memory(self) -> bool:
        """Whether batches are worth pinning: not lists of encoded files."""
        return False

    def _sample(self, data: bytes, label: int, path: str) -> Any:
        image = self.open(data)
        box, flip = crop_box(image.width, image.height, self.size, self.train, self.preset)
        mode = "RGB" if self.channels == 3 else "L"
        if image.format == "JPEG" and image.mode == mode and data[-2:] == b"\xff\xd9":
            return data, box, flip, label, path  # bytes: decoded on the device
        pixels = pil_crop(image, box, flip, self.size, self.channels)  # loads: a cut file fails
        return pixels, box, flip, label, path

    def collate(self, samples: list[Any]) -> Encoded:
        """The batch's samples (skipped corrupt ones dropped) as `Encoded`."""
        kept = [s for s in samples if s is not None]
        if not kept:
            raise all_corrupt(len(samples))
        pixels, boxes, flips, labels, paths = zip(*kept, strict=True)
        encoded_at = [i for i, p in enumerate(pixels) if isinstance(p, bytes)]
        ready_at = [i for i, p in enumerate(pixels) if not isinstance(p, bytes)]
        flat = b"".join(pixels[i] for i in encoded_at)
        return Encoded(
            torch.frombuffer(bytearray(flat), dtype=torch.uint8) if flat else _EMPTY,
            [len(pixels[i]) for i in encoded_at],
            encoded_at,
            torch.stack([pixels[i] for i in ready_at]) if ready_at else None,
            ready_at,
            torch.tensor(boxes, dtype=torch.float64),
            torch.tensor(flips, dtype=torch.bool),
            torch.tensor(labels),
            paths,
        )

    def on_device(self, batch: Encoded, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        files = batch.encoded
        images = decode(files, device, self.decoder, self.channels)
        crops: list[tuple[int, torch.Tensor]] = []  # decoded here, cropped and flipped
        for at, image, data in zip(batch.encoded_at, images, files, strict=True):
            if image is not None:
                continue
            pixels = self._pillow(data.numpy().tobytes(), batch, at)
            if pixels is not None:
                crops.append((at, pixels))
        decoded = [
            (at, im) for at, im in zip(batch.encoded_at, images, strict=True) if im is not None
        ]
        if batch.ready is not None:
            crops += list(zip(batch.ready_at, batch.ready, strict=True))
        if not decoded and not crops:
            raise all_corrupt(len(batch.labels))
        x, order = finish(decoded, crops, batch, self.size, device)
        scale, shift = _normalising(self.normalize, device)
        out = torch.empty_like(x, dtype=torch.float32, memory_format=torch.channels_last)
        torch.addcmul(shift, x, scale, out=out)
        return out, to_device(batch.labels[torch.tensor(order)], device)

    def _pillow(self, data: bytes, batch: Encoded, at: int) -> torch.Tensor | None:
        """A JPEG the device decoder refused, decoded by Pillow here (None: skipped)."""
        box = tuple(float(v) for v in batch.boxes[at].tolist())
        try:
            image = self.open(data)
            return pil_crop(image, box, bool(batch.flips[at]), self.size, self.channels)  # type: ignore[arg-type]
        except (OSError, ValueError, SyntaxError) as e:
            self.corrupt(batch.paths[at], e)  # raises, unless skipped
            return None


def decode(
    data: list[torch.Tensor], device: torch.device, decoder: str, channels: int
) -> list[torch.Tensor | None]:
    """JPEG files (1-D uint8) decoded on `device` in one call, as (C, H, W) uint8; None where
    the decoder refused a file."""
    if not data:
        return []
    if decoder == "nvimgcodec":
        return _nvimgcodec(data, device, channels)
    from torchvision.io import ImageReadMode, decode_jpeg  # noqa: PLC0415 - off the pre-flight

    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)  # torchcodec
    if device.type == "cuda":
        # torchvision takes the images' memory on this thread's stream, then nvJPEG writes them
        # from a stream of its own that does not wait for this one: memory freed here that
        # queued kernels still read (the last batch's crops) would be overwritten under them
        # (pytorch/vision#9606; bench/decode_race.py). This stream's queued work ends first.
        torch.cuda.current_stream(device).synchronize()
    try:
        return list(decode_jpeg(data, mode=mode, device=device))
    except RuntimeError:  # one bad file fails the batch: find it
        pass
    out: list[torch.Tensor | None] = []
    for raw in data:
        try:
            out.append(decode_jpeg(raw, mode=mode, device=device))
        except RuntimeError:
            out.append(None)
    return out


_pool: dict[str, list[Any]] = {}  # nvImageCodec decoders per device, each used by one thread
_pool_lock = threading.Lock()
_fell_back: list[str] = []  # why nvImageCodec made no decoder, once said


def _nvimgcodec(
    data: list[torch.Tensor], device: torch.device, channels: int
) -> list[torch.Tensor | None]:
    from nvidia import nvimgcodec  # noqa: PLC0415 - optional

    with _pool_lock:
        free = _pool.setdefault(str(device), [])
        decoder = free.pop() if free else None
    if decoder is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 4
        kinds = (nvimgcodec.BackendKind.HW_GPU_ONLY, nvimgcodec.BackendKind.GPU_ONLY)
        try:
            with _without_codec_noise():
                decoder = nvimgcodec.Decoder(
                    device_id=device.index
                    if device.index is not None
                    else torch.cuda.current_device(),
                    max_num_cpu_threads=max(1, min(4, cores)),  # per rank: its parsing threads
                    backends=[nvimgcodec.Backend(k) for k in kinds],
                )
        except RuntimeError as e:  # seen once on an H200: "Could not create decoder. Code: 7"
            if not _fell_back:
                _fell_back.append(str(e))
                log.warning(
                    "data.decode=nvimgcodec: nvImageCodec made no decoder (%s); torchvision's "
                    "nvJPEG decodes instead",
                    " ".join(str(e).split())[:160],
                )
            return decode(data, device, "gpu", channels)
    try:
        streams, params = nvimgcodec_inputs(data, channels)
        stream = torch.cuda.current_stream(device).cuda_stream
        images = decoder.decode(streams, params=params, cuda_stream=stream)
    finally:
        with _pool_lock:
            _pool[str(device)].append(decoder)
    out: list[torch.Tensor | None] = []
    for image in images:
        if image is None:
            out.append(None)
            continue
        t = torch.as_tensor(image, device=device)  # HWC, shares the decoder's buffer
        out.append((t.unsqueeze(-1) if t.dim() == 2 else t).permute(2, 0, 1))
    return out


def nvimgcodec_inputs(data: list[torch.Tensor], channels: int) -> tuple[list[Any], Any]:
    """What nvImageCodec's batched decode takes: a CodeStream per file (1-D uint8), and the
    parameters (sRGB or grey, 8 bits, no EXIF rotation: as Pillow's path)."""
    from nvidia import nvimgcodec  # noqa: PLC0415 - optional

    spec = nvimgcodec.ColorSpec.SRGB if channels == 3 else nvimgcodec.ColorSpec.GRAY
    params = nvimgcodec.DecodeParams(
        apply_exif_orientation=False, color_spec=spec, allow_any_depth=False
    )
    return [nvimgcodec.CodeStream(d.numpy()) for d in data], params


def finish(
    decoded: list[tuple[int, torch.Tensor]],
    crops: list[tuple[int, torch.Tensor]],
    batch: Encoded,
    size: int,
    device: torch.device,
) -> tuple[torch.Tensor, list[int]]:
    """The batch as one (n, C, size, size) tensor on `device` (float16 on CUDA while all its
    images were decoded there, else float32), and the batch places of its rows: the `decoded`
    images' boxes resized and flipped (`gpucrop.crop_resize`: a few kernels whatever the
    images' sizes), then the `crops`, already cropped and flipped."""
    parts, order = [], []
    if decoded:
        at = [a for a, _ in decoded]
        out, rows = crop_resize([im for _, im in decoded], batch.boxes[at], batch.flips[at], size)
        parts.append(out)
        order += [at[r] for r in rows]
    if crops:
        parts.append(to_device(torch.stack([c for _, c in crops]), device).float())
        order += [at for at, _ in crops]
    x = torch.cat(parts) if len(parts) > 1 else parts[0]
    rows = sorted(range(len(order)), key=order.__getitem__)  # back into the batch's order
    if rows != list(range(len(order))):
        x = x[to_device(torch.tensor(rows), device)]
    return x, sorted(order)


_norms: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _normalising(normalize: Normalized, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 / std, -mean / std) on `device`: normalisation as one fused multiply-add (kept per
    device: no copy to the device per batch)."""
    stats = (normalize.mean.flatten().tolist(), normalize.std.flatten().tolist())
    key = (*map(tuple, stats), str(device))
    if key not in _norms:
        scale = 1 / normalize.std
        _norms[key] = (scale.to(device), (-normalize.mean * scale).to(device))
    return _norms[key]
