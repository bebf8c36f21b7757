"""Image files decoded on the device (data.decode=gpu|nvimgcodec, `gpuimages.DeviceDecoded`),
run here with torchvision's decode_jpeg on the CPU: the same batched path, the same crops as the
CPU path's per-sample reference, the fallback to Pillow, corrupt files, and how auto picks."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest
import torch
from conftest import image_tree
from PIL import Image, ImageDraw, ImageFilter

from expctl.builtin.datasets import gpuimages, images
from expctl.builtin.datasets.gpuimages import INSTALL, DeviceDecoded
from expctl.builtin.datasets.imagefiles import CorruptImage, ImageFiles
from expctl.builtin.datasets.images import image_folder
from expctl.builtin.reader import Loading
from expctl.errors import UserError
from expctl.rank.batches import TrainBatches, val_batches

CPU = torch.device("cpu")


def _folder(root: Path) -> list[tuple[str, int]]:
    """image_tree's small JPEG (RGB, grey, CMYK) and PNG files, plus RGB JPEGs larger than the
    samples (crops scaled down), as image_folder lists them."""
    image_tree(root, classes=2, per_class=10)
    rng = random.Random(0)
    for i in range(6):  # shapes on a textured ground, as photographs are: not white noise
        w, h = rng.randint(60, 160), rng.randint(60, 160)
        image = Image.effect_noise((w, h), 20).convert("RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x, y = sorted(rng.sample(range(w), 2)), sorted(rng.sample(range(h), 2))
            fill = tuple(rng.randrange(256) for _ in range(3))
            draw.ellipse([x[0], y[0], x[1], y[1]], fill=fill)  # type: ignore[arg-type]
        image.filter(ImageFilter.GaussianBlur(1)).save(
            root / "class_0" / f"big_{i}.jpg", quality=90
        )
    return image_folder(root=str(root), val=None, image_size=32).train.samples  # type: ignore[attr-defined]


def _pair(samples: list[tuple[str, int]], train: bool, **kw: str) -> tuple[ImageFiles, ImageFiles]:
    cpu = image_folder(root=str(Path(samples[0][0]).parents[1]), val=None, image_size=32)
    norm = cpu.train.normalize  # type: ignore[attr-defined]
    return (
        ImageFiles(samples, 32, 3, train, "imagenet", norm, **kw),
        DeviceDecoded(samples, 32, 3, train, "imagenet", norm, "gpu", **kw),
    )


def _device_decoded(ds: ImageFiles) -> set[str]:
    """The files of `ds` that the worker hands to the device decoder."""
    batch = ds.collate([ds[i] for i in range(len(ds))])
    return {batch.paths[i] for i in batch.encoded_at}


@pytest.mark.parametrize("train", [True, False], ids=["random-resized-crop", "centre-crop"])
def test_the_batched_path_equals_the_per_sample_reference(tmp_path: Path, train: bool) -> None:
    """One batch of JPEGs (decoded by one decode_jpeg call, resized together: `crop_resize`)
    and fallback files (grey, CMYK JPEG, PNG: Pillow in the worker, in the same batch): the
    crops the CPU path draws for the same (seed, epoch, index), within 3 grey levels; the
    fallback samples bit for bit; normalised, channels_last."""
    samples = _folder(tmp_path)
    cpu, gpu = _pair(samples, train)
    on_device = _device_decoded(gpu)
    assert len(on_device) == 10 and any("big_" in p for p in on_device)
    if train:
        read = TrainBatches(cpu, len(cpu), 0, 1, 5, CPU, Loading(0))
        (x_ref, y_ref), order = next(read.epoch(1)), list(iter(read.sampler))
        x, y = next(TrainBatches(gpu, len(gpu), 0, 1, 5, CPU, Loading(0)).epoch(1))
    else:
        (x_ref, y_ref), order = next(val_batches(cpu, 64, 0, 1, CPU)), list(range(len(cpu)))
        x, y = next(val_batches(gpu, 64, 0, 1, CPU))
    assert torch.equal(y, y_ref) and x.shape == x_ref.shape == (len(samples), 3, 32, 32)
    assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
    std = torch.tensor(images.IMAGENET_STD).view(3, 1, 1) * 255  # back to grey levels
    for row, index in enumerate(order):
        diff = float(((x[row] - x_ref[row]) * std).abs().mean())
        if samples[index][0] in on_device:
            # (the CPU path's own DCT-scaled decoding is up to ~2 grey levels off a full decode)
            assert diff < 3.0, (samples[index][0], diff)
        else:
            assert diff < 1e-3, samples[index][0]


def test_one_crop_of_many_sizes_is_roi_align_per_image() -> None:
    """`gpucrop.crop_resize` resizes a batch of images of many sizes (as photographs come: one
    bucket up to 512 pixels a side, larger ones in their own, an image smaller than the output)
    in one go: each row is torchvision's roi_align of that image alone (aligned, adaptive
    sampling), flipped where asked, to float rounding; every image comes back once."""
    from torchvision.ops import roi_align  # noqa: PLC0415

    from expctl.builtin.datasets.gpucrop import crop_resize  # noqa: PLC0415
    from expctl.builtin.datasets.imagefiles import crop_box  # noqa: PLC0415

    rng = random.Random(3)
    torch.manual_seed(3)
    shapes = [(375, 500), (500, 375), (333, 500), (700, 1100), (1030, 513), (20, 30)]
    images, boxes, flips = [], [], []
    for k in range(24):
        h, w = shapes[k % len(shapes)] if k % 4 else (rng.randint(40, 600), rng.randint(40, 600))
        images.append(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
        box, flip = crop_box(w, h, 64, k % 3 > 0, "imagenet")  # random crops and centre crops
        boxes.append(box)
        flips.append(flip)
    assert any(flips) and not all(flips)
    boxes_t, flips_t = torch.tensor(boxes, dtype=torch.float64), torch.tensor(flips)
    out, order = crop_resize(images, boxes_t, flips_t, 64)
    assert sorted(order) == list(range(24)) and out.shape == (24, 3, 64, 64)
    for row, k in enumerate(order):
        roi = torch.tensor([[0.0, *boxes[k]]])
        ref = roi_align(images[k][None].float(), roi, (64, 64), 1.0, -1, aligned=True)[0]
        ref = ref.flip(-1) if flips[k] else ref
        assert float((out[row] - ref).abs().max()) < 1e-3, (k, images[k].shape, boxes[k])


@pytest.mark.slow
def test_the_batches_do_not_depend_on_workers_and_a_resumed_epoch_sees_the_same(
    tmp_path: Path,
) -> None:
    """The crops are drawn by the worker from (seed, epoch, index): 0 or 2 DataLoader workers
    give the same batches, and an epoch resumed at its third batch the same last batches."""
    samples = _folder(tmp_path)
    _, gpu = _pair(samples, train=True)
    whole = list(TrainBatches(gpu, 6, 0, 1, 3, CPU, Loading(0)).epoch(2))
    workers = list(TrainBatches(gpu, 6, 0, 1, 3, CPU, Loading(2)).epoch(2))
    resumed = list(TrainBatches(gpu, 6, 0, 1, 3, CPU, Loading(2)).epoch(2, start=2))
    assert len(whole) == 4 and len(resumed) == 2
    for a, b in zip(whole, workers, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for a, b in zip(whole[2:], resumed, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    other = list(TrainBatches(gpu, 6, 0, 1, 3, CPU, Loading(0)).epoch(3))
    assert not torch.equal(whole[0][0], other[0][0]), "each epoch its own crops"


def _bad_huffman(path: Path) -> None:
    """A JPEG whose header reads (a worker sends it on) but whose Huffman table no decoder
    takes: refused on the device, then by Pillow in the training process."""
    data = bytearray(path.read_bytes())
    at = data.index(b"\xff\xc4")
    data[at + 5 : at + 21] = b"\xff" * 16
    path.write_bytes(bytes(data))


def test_a_corrupt_file_is_named_or_skipped_as_on_the_cpu_path(tmp_path: Path) -> None:
    samples = _folder(tmp_path)
    big = next(i for i, (p, _) in enumerate(samples) if "big_0" in p)
    cut = next(i for i, (p, _) in enumerate(samples) if p.endswith("img_000.jpg"))
    Path(samples[cut][0]).write_bytes(Path(samples[cut][0]).read_bytes()[:300])
    _bad_huffman(Path(samples[big][0]))
    good = [i for i in range(len(samples)) if i not in (cut, big)][:2]
    cpu, gpu = _pair(samples, train=True)
    for index in (cut, big):  # a cut file in the worker; a bad one in the training process
        with pytest.raises(CorruptImage) as on_cpu:
            cpu[index]
        with pytest.raises(CorruptImage) as on_gpu:
            gpu.on_device(gpu.collate([gpu[i] for i in (good[0], index, good[1])]), CPU)
        assert str(on_gpu.value) == str(on_cpu.value)
        assert f"image {samples[index][0]} cannot be decoded" in str(on_gpu.value)
    _, skip = _pair(samples, train=True, on_corrupt="skip")
    x, y = skip.on_device(skip.collate([skip[i] for i in (good[0], cut, big, good[1])]), CPU)
    assert x.shape[0] == 2 and y.tolist() == [samples[i][1] for i in good]


def test_decode_auto_picks_by_the_documented_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert images._pick_decode("auto", CPU) == ("cpu", "data.decode=auto: no CUDA device")
    assert images._pick_decode("cpu", "cuda:0") == ("cpu", "")
    assert images._pick_decode("gpu", "cuda:0") == ("gpu", "data.decode=gpu")
    with pytest.raises(UserError, match="data.decode=gpu needs a CUDA device"):
        images._pick_decode("gpu", CPU)
    with pytest.raises(UserError, match="data.decode=nvimgcodec needs a CUDA device"):
        images._pick_decode("nvimgcodec", CPU)  # said before nvImageCodec is imported
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)  # as torchrun sets them
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setattr(images.os, "sched_getaffinity", lambda _: set(range(32)), raising=False)
    assert images._pick_decode("auto", "cuda:0") == (
        "cpu",
        "data.decode=auto: 32 cores per GPU >= 32",
    )
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert images._pick_decode("auto", "cuda:0") == (
        "gpu",
        "data.decode=auto: 16 cores per GPU < 32",
    )
    missing = images.nvimgcodec_missing()
    if missing is None:
        pytest.skip("nvImageCodec is installed here")
    with pytest.raises(UserError, match="nvImageCodec cannot be imported") as e:
        images._pick_decode("nvimgcodec", "cuda:0")
    assert e.value.hint == INSTALL


def test_nvimgcodecs_noise_about_libraries_it_does_not_need_is_dropped(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """nvImageCodec's lines about nvJPEG2000 and nvTIFF (not installed, not used) are dropped;
    anything else written to stderr meanwhile still reaches it."""
    with gpuimages._without_codec_noise():
        os.write(2, b"Failed to load nvjpeg2k library! Please install nvJPEG2000\n")
        os.write(2, b"[nvtiff_ext] Failed to load nvTIFF library\n")
        os.write(2, b"something else went wrong\n")
    assert capfd.readouterr().err == "something else went wrong\n"


def test_nvimgcodec_takes_the_batch_as_code_streams_with_pillows_colours() -> None:
    """What the batched decode is given (no GPU needed to build it): one CodeStream per file
    and sRGB (or grey) 8-bit output without EXIF rotation. Where nvImageCodec is installed."""
    if images.nvimgcodec_missing() is not None:
        pytest.skip("nvImageCodec is not installed here")
    from nvidia import nvimgcodec  # noqa: PLC0415 - optional

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, "JPEG")
    data = [torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)] * 2
    for channels, spec in ((3, nvimgcodec.ColorSpec.SRGB), (1, nvimgcodec.ColorSpec.GRAY)):
        streams, params = gpuimages.nvimgcodec_inputs(data, channels)
        assert [(s.width, s.height) for s in streams] == [(40, 30)] * 2
        assert params.color_spec == spec and not params.apply_exif_orientation
