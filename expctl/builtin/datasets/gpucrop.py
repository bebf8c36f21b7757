"""Crop boxes of a batch of images of many sizes, resized to one square size and flipped, on the
device, in a number of kernels that does not grow with the number of sizes: `crop_resize`.

The arithmetic is torchvision's `roi_align` (``aligned=True``, ``sampling_ratio=-1``): each output
pixel averages ceil(box / size) x ceil(box / size) bilinear samples of its bin, an antialiasing
filter within ~1 grey level of Pillow's resize. roi_align takes one tensor of same-sized images,
so a batch of real photographs (ImageNet's have ~100 sizes in a batch of 256) would cost one call
and its copies per size. Here the filter is written as what it is, separable: an output pixel is
``sum_r sum_s Wy[i, r] * Wx[j, s] * image[r, s]``, so a whole bucket of images, padded with zeros
to one size, is resized by two batched matmuls, ``Wy @ image @ Wx.T``, whose weight matrices
(zero past each image's own rows and columns) are built for the batch at once. A flip reverses
Wx's rows. Images up to 512 pixels a side share one bucket; larger ones go to buckets of 512
pixel steps, so one large photograph does not pad a whole batch to its size.
"""

from __future__ import annotations

import math

import torch

BUCKET = 512  # pixels: images are padded to their bucket's largest height and width


def crop_resize(
    images: list[torch.Tensor], boxes: torch.Tensor, flips: torch.Tensor, size: int
) -> tuple[torch.Tensor, list[int]]:
    """`images` ((C, H, W) uint8, one device) cropped to `boxes` ((n, 4) host float: left, top,
    right, bottom in the image's pixels, Pillow's convention), resized to (size, size) and
    flipped where `flips` ((n,) host bool), as one (n, C, size, size) tensor (float16 on CUDA,
    float32 elsewhere) whose rows are in bucket order, and the places in `images` of its
    rows."""
    device = images[0].device
    half = device.type == "cuda"  # exact for 0..255; the matmuls accumulate in float32
    dtype = torch.float16 if half else torch.float32
    sizes: dict[tuple[int, ...], list[int]] = {}  # same-sized images: copied in one go
    for k, image in enumerate(images):
        sizes.setdefault(tuple(image.shape), []).append(k)
    buckets: dict[tuple[int, int], list[list[int]]] = {}
    for (_, h, w), same in sizes.items():
        buckets.setdefault((math.ceil(h / BUCKET), math.ceil(w / BUCKET)), []).append(same)
    order = [k for groups in buckets.values() for same in groups for k in same]
    extents = torch.tensor([images[k].shape[-2:] for k in order], dtype=torch.float32)
    box = boxes[order].float()
    # one copy to the device: each row's box, height, width and flip
    meta = to_device(torch.cat([box, extents, flips[order].float()[:, None]], 1), device)
    flip = meta[:, 6] > 0.5
    ys = _samples(meta[:, 1], meta[:, 3], meta[:, 4], size, _most(box[:, 3] - box[:, 1], size))
    xs = _samples(
        meta[:, 0], meta[:, 2], meta[:, 5], size, _most(box[:, 2] - box[:, 0], size), flip
    )
    parts, at = [], 0
    for groups in buckets.values():
        n, c = sum(map(len, groups)), images[groups[0][0]].shape[0]
        hp = max(images[same[0]].shape[-2] for same in groups)
        wp = max(images[same[0]].shape[-1] for same in groups)
        rows = slice(at, at + n)
        # (n, H, C, W): a bucket's channels side by side, so each matmul is one bmm
        padded = torch.zeros((n, hp, c, wp), dtype=dtype, device=device)
        j = 0
        for same in groups:
            _, h, w = images[same[0]].shape
            first = images[same[0]][None]
            one = first if len(same) == 1 else torch.stack([images[k] for k in same])
            padded[j : j + len(same), :h, :, :w] = one.permute(0, 2, 1, 3)
            j += len(same)
        wy = _matrix(ys, rows, hp, dtype)  # (n, size, hp)
        wx = _matrix(xs, rows, wp, dtype)  # (n, size, wp)
        tall = torch.bmm(wy, padded.view(n, hp, c * wp))  # (n, size, C * wp)
        out = torch.bmm(tall.view(n, size * c, wp), wx.transpose(1, 2))  # (n, size * C, size)
        parts.append(out.view(n, size, c, size).permute(0, 2, 1, 3))
        at += n
    return (torch.cat(parts) if len(parts) > 1 else parts[0]), order


def _most(length: torch.Tensor, size: int) -> int:
    """The most samples per bin of any row along one axis (from the host's boxes: no sync)."""
    return max(1, int(torch.ceil(length / size).max()))


Samples = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _samples(
    start: torch.Tensor,
    end: torch.Tensor,
    extent: torch.Tensor,
    size: int,
    most: int,
    flip: torch.Tensor | None = None,
) -> Samples:
    """roi_align's samples along one axis, for every row at once: the (n, size, G) pixel
    indices of each sample's two neighbours and their weights (already divided by the samples
    per bin), G = `most`, the most samples per bin of any row; output places reversed in the
    rows `flip` names."""
    device = start.device
    roi_start = start - 0.5  # aligned=True: pixel centres at +0.5
    length = end - start
    bin_size = length / size
    grid = torch.ceil(length / size).clamp_min(1)
    out_at = torch.arange(size, device=device, dtype=torch.float32)[None, :, None]
    if flip is not None:  # output pixel j of a flipped row is pixel size - 1 - j of the crop
        out_at = torch.where(flip[:, None, None], size - 1 - out_at, out_at)
    sample = torch.arange(most, device=device, dtype=torch.float32)[None, None, :]
    bin_size, grid = bin_size[:, None, None], grid[:, None, None]
    roi_start, extent = roi_start[:, None, None], extent[:, None, None]
    pos = roi_start + out_at * bin_size + (sample + 0.5) * bin_size / grid
    valid = (sample < grid) & (pos >= -1.0) & (pos <= extent)
    pos = pos.clamp_min(0.0)
    low = pos.floor()
    at_end = low >= extent - 1
    low = torch.where(at_end, extent - 1, low)
    high = torch.where(at_end, low, low + 1)
    pos = torch.where(at_end, low, pos)
    frac = pos - low
    keep = valid.float() / grid
    return low.long(), high.long(), (1 - frac) * keep, frac * keep


def _matrix(s: Samples, rows: slice, extent: int, dtype: torch.dtype) -> torch.Tensor:
    """The (n, size, extent) weights of one bucket's rows along one axis."""
    low, high, w_low, w_high = (t[rows] for t in s)
    n, size, _ = low.shape
    m = torch.zeros((n, size, extent), dtype=torch.float32, device=low.device)
    m.scatter_add_(2, low, w_low)
    m.scatter_add_(2, high, w_high)
    return m.to(dtype)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` (host memory) copied to `device` without waiting: on CUDA from pinned memory. From
    pageable memory a copy first waits for all the work queued on the stream (the batch's decode
    and crops, behind the training step's kernels): the feeding thread would stall mid-batch."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
