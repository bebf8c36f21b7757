"""Real data: datasets read from files in their own on-disk formats, your own images and tables,
the dataset contract, and the streamed data path (DataLoader workers, DDP shards)."""

from __future__ import annotations

import io
import json
import logging
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import expctl, image_tree, run_dirs
from torch.utils.data import Dataset

from expctl.builtin.data import check_splits
from expctl.builtin.datasets.arrays import arrays
from expctl.builtin.datasets.folders import EXTENSIONS, scan_folder
from expctl.builtin.datasets.idx import fashion_mnist, find_idx
from expctl.builtin.datasets.imagefiles import CorruptImage, ImageFiles, Normalized
from expctl.builtin.datasets.images import image_folder
from expctl.builtin.datasets.tensors import carve
from expctl.builtin.datasets.vision import cifar10
from expctl.builtin.reader import Loading
from expctl.config.frozen import legacy_counts
from expctl.errors import UserError
from expctl.rank.batches import TrainBatches, ahead, val_batches

CPU = torch.device("cpu")


class Indexed(Dataset[Any]):
    """Sample i is (i as a float tensor, a random draw): which samples a rank read, and what its
    random transforms drew."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(i)]), torch.rand(1)


def _epoch(workers: int, rank: int, epoch: int, n: int = 103) -> list[torch.Tensor]:
    batches = TrainBatches(Indexed(n), 5, rank, 2, 7, CPU, Loading(workers))
    return list(batches.epoch(epoch))


def test_streamed_ranks_read_each_sample_once_per_epoch() -> None:
    seen: list[int] = []
    for rank in (0, 1):
        for x, _ in _epoch(2, rank, epoch=0):
            seen += x.view(-1).long().tolist()
    assert len(seen) == len(set(seen)) == 2 * (103 // 2 // 5) * 5  # 100: full batches only
    again = [int(v) for x, _ in _epoch(2, 0, epoch=1) for v in x.view(-1)]
    assert again != seen[:50], "each epoch has its own order"


def test_streamed_random_transforms_do_not_depend_on_num_workers() -> None:
    """Seeded per (seed, epoch, index): the same draws with 0, 1 or 2 DataLoader workers."""
    draws = {}
    for workers in (0, 1, 2):
        draws[workers] = torch.cat([r for _, r in _epoch(workers, 1, epoch=2)])
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    assert len(set(draws[0].view(-1).tolist())) == draws[0].numel(), "each sample its own draw"


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_with_no_validation_between_are_read_as_one_pass_and_the_same_batches(
    workers: int,
) -> None:
    """The epochs up to a validation are one pass of the workers (they read the next epoch's
    first batches while this one's last ones train), and give exactly the batches each epoch
    gives alone: the same samples and random draws, the epoch's leftover batches (gradient
    accumulation's) left out, a resumed epoch's first ones skipped."""

    def alone(epoch: int, start: int = 0) -> list[torch.Tensor]:
        one = TrainBatches(Indexed(83), 5, 1, 2, 7, CPU, Loading(workers))
        return [torch.cat(b) for b in one.epoch(epoch, start, count=7)]

    streak = TrainBatches(Indexed(83), 5, 1, 2, 7, CPU, Loading(workers))
    assert streak.steps_per_epoch == 8
    got = [[torch.cat(b) for b in streak.epoch(e, 0, count=7, through=2)] for e in (0, 1, 2)]
    for e in (0, 1, 2):
        assert len(got[e]) == 7 and all(
            torch.equal(a, b) for a, b in zip(got[e], alone(e), strict=True)
        ), e
    assert streak.reader is not None and streak.reader._turn == 1, "one pass for the streak"
    assert not torch.equal(got[0][0], got[1][0]), "each epoch its own order and draws"
    resumed = [torch.cat(b) for b in streak.epoch(1, 3, count=7, through=2)]  # a new pass
    assert all(torch.equal(a, b) for a, b in zip(resumed, alone(1)[3:], strict=True))
    assert streak.reader._turn == 2
    streak.close()


def test_the_streak_of_epochs_read_as_one_ends_at_the_next_validation() -> None:
    from expctl.config.schema import TrainConfig
    from expctl.rank.train import _validated_after

    def last(epoch: int, **train: Any) -> int:
        return _validated_after(TrainConfig(**train), epoch)

    assert [last(e) for e in range(3)] == [0, 1, 2]  # val_every=1: every epoch ends in one
    assert [last(e, val_every=3) for e in range(7)] == [2, 2, 2, 5, 5, 5, 8]
    assert last(3, val_every=10, max_epochs=6) == 5  # and at the last epoch
    assert last(9, val_every=10, max_epochs=6) == 9  # (past it: none beyond this one)
    assert last(0, val_every=3, val_every_steps=50) == 0  # validations inside epochs


def test_a_worker_says_nothing_of_a_batch_its_rank_no_longer_takes() -> None:
    """A Ctrl-C ends the workers with batches in flight: the connection error that the
    worker's resource_sharer thread then meets is not printed; any other error is."""
    from expctl.builtin.reader import _quiet_when_abandoned

    said: list[type[BaseException]] = []
    hook = _quiet_when_abandoned(lambda kind, error, tb: said.append(kind))
    for where, error in [
        ("multiprocessing/resource_sharer.py", "ConnectionRefusedError"),
        ("multiprocessing/resource_sharer.py", "ValueError"),
        ("mydataset.py", "ConnectionRefusedError"),
    ]:
        try:
            exec(compile(f"raise {error}()", where, "exec"))
        except Exception as e:
            hook(type(e), e, e.__traceback__)
    assert said == [ValueError, ConnectionRefusedError]


def test_a_process_that_never_closed_its_reader_still_exits() -> None:
    """Workers ignore SIGTERM (the rank acts on it); Python's exit sends them that and waits:
    a reader dropped unclosed (after an error, in a user's script) must not hang the exit."""
    import subprocess
    import sys

    code = (
        "import torch; from torch.utils.data import TensorDataset\n"
        "from expctl.builtin.reader import Loading, Reader\n"
        "r = Reader({'train': TensorDataset(torch.arange(8.0))}, Loading(2), 0, 0)\n"
        "print(len(next(r.read('train', 0, [[0, 1], [2, 3]]))[0]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and proc.stdout.strip() == "2", proc.stderr


def test_validation_is_streamed_whole_with_workers() -> None:
    got = [
        int(v)
        for rank in (0, 1)
        for x, _ in val_batches(Indexed(11), 4, rank, 2, CPU, Loading(2))
        for v in x.view(-1)
    ]
    assert sorted(got) == list(range(11))


def test_batches_finished_ahead_by_a_thread_keep_order_errors_and_stop_early() -> None:
    import threading

    def finish(batch: int) -> tuple[int, ...]:
        if batch == 7:
            raise CorruptImage("image x.jpg cannot be decoded")
        return (batch * 10,)

    for threads in (1, 3):
        assert list(ahead(iter(range(7)), finish, CPU, threads)) == [(i * 10,) for i in range(7)]
        with pytest.raises(CorruptImage, match="x.jpg"):
            list(ahead(iter(range(20)), finish, CPU, threads))
    early = ahead(iter(range(1000)), finish, CPU, threads=2)
    assert next(early) == (0,)
    early.close()  # the consumer leaves: the thread ends instead of waiting forever
    assert not any(t.name == "expctl-feed" for t in threading.enumerate())


# ---------------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------------


def test_a_factory_returning_the_wrong_type_is_named_with_the_contract() -> None:
    with pytest.raises(UserError, match=r"returned tuple, not expctl.Splits") as e:
        check_splits("mine", (Indexed(3), Indexed(3)))
    assert "expctl.DataInfo(input_shape=" in (e.value.hint or "")
    import expctl

    with pytest.raises(UserError, match=r"Splits.train is Tensor, not a map-style Dataset"):
        check_splits("mine", expctl.Splits(torch.zeros(3), None, expctl.DataInfo((1,), 2)))  # type: ignore[arg-type]
    with pytest.raises(UserError, match=r"a training sample is int, not a tuple"):
        check_splits("mine", expctl.Splits([1, 2], None, expctl.DataInfo((1,), 2)))  # type: ignore[arg-type]


PLUGIN = """
import torch
from torch import nn
import expctl

@expctl.register("datasets")
def blobs(n: int = 96) -> expctl.Splits:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 3
    x = torch.randn(n, 5, generator=g) + 3 * nn.functional.one_hot(y, 5).float()
    ds = torch.utils.data.TensorDataset(x, y)
    return expctl.Splits(ds, ds, expctl.DataInfo(input_shape=(5,), num_classes=3))

@expctl.register("models")
def tiny_net(input_shape=(1,), num_classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))
"""


@pytest.mark.slow
def test_a_plugin_dataset_fills_the_model_arguments_it_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user model whose factory takes num_classes gets 3 from the data, not its default 10."""
    (tmp_path / "blobs_plugin.py").write_text(PLUGIN)
    (tmp_path / "c.yml").write_text(
        "imports: [blobs_plugin]\nmodel: {name: tiny_net}\ndata: {name: blobs, batch_size: 16}\n"
        "train: {max_epochs: 1}\n"
    )
    expctl("run", "-C", "c.yml", cwd=tmp_path)
    import expctl as api

    (run,) = run_dirs(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)  # where blobs_plugin.py is
    model = api.load_model(run)
    assert model(torch.zeros(2, 5)).shape == (2, 3)


# ---------------------------------------------------------------------------------------------
# torchvision datasets from their own files
# ---------------------------------------------------------------------------------------------


def test_fashion_mnist_not_found_names_the_absolute_folders_it_looked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.root=null: the error names each default folder looked in by its absolute path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("expctl.builtin.datasets.idx.FASHION_DIRS", ("/nonexistent/fm", "data"))
    with pytest.raises(UserError) as e:
        find_idx("fashion_mnist", None)
    assert f"not found under /nonexistent/fm, {tmp_path / 'data'} (data.root=null: the" in str(
        e.value
    )


def test_fashion_mnist_from_debians_files() -> None:
    try:
        find_idx("fashion_mnist", None)
    except UserError:
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    s = fashion_mnist(val_split=5000)
    assert (len(s.train), len(s.val), len(s.test)) == (55000, 5000, 10000)  # type: ignore[arg-type]
    labels = torch.cat([s.train.tensors[1], s.val.tensors[1]])  # type: ignore[union-attr]
    assert torch.bincount(labels).tolist() == [6000] * 10  # the genuine training split
    assert torch.bincount(s.test.tensors[1]).tolist() == [1000] * 10  # type: ignore[union-attr]
    assert s.info.input_shape == (1, 28, 28) and s.info.classes[0] == "T-shirt/top"  # type: ignore[index]
    x = s.train.tensors[0]  # type: ignore[union-attr]
    assert abs(float(x.mean())) < 0.02 and abs(float(x.std()) - 1) < 0.02  # standardised


class _Python2Pickler(pickle._Pickler):
    """Pickles as Python 2 did, and as the published CIFAR files are: bytes as Python 2's str
    (Python 3 calls _codecs.encode at protocol 2), numpy 1's module names."""

    def save_bytes(self, obj: bytes) -> None:
        self.write(pickle.BINSTRING + len(obj).to_bytes(4, "little") + obj)
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, bytes: save_bytes}


def _pickled(obj: object, protocol: int | str) -> bytes:
    if protocol != "python2":
        return pickle.dumps(obj, protocol=int(protocol))
    out = io.BytesIO()
    _Python2Pickler(out, protocol=2).dump(obj)
    return out.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def _cifar_batch(
    path: Path, images: np.ndarray, labels: list[int], protocol: int | str = 4
) -> None:
    path.write_bytes(
        _pickled({"data": images.reshape(len(labels), -1), "labels": labels}, protocol)
    )


def test_cifar10_from_its_python_batches(tmp_path: Path) -> None:
    """Batches as the published files pickle them (Python 2), and as Python 3 does (protocols 4
    and 5: numpy 2's reconstruction functions)."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    train_labels = []
    for i, protocol in zip(range(1, 6), ["python2", 4, 5, "python2", 4], strict=True):
        labels = [(i + j) % 10 for j in range(4)]
        train_labels += labels
        images = rng.integers(0, 256, (4, 3, 32, 32), np.uint8)
        _cifar_batch(folder / f"data_batch_{i}", images, labels, protocol)
    pixel = np.zeros((3, 3, 32, 32), np.uint8)
    pixel[1, 2, 5, 7] = 255  # image 1, blue channel, row 5, column 7
    _cifar_batch(folder / "test_batch", pixel, [3, 1, 4], "python2")
    meta = {"label_names": [f"c{i}" for i in range(10)], "num_vis": 3072}
    (folder / "batches.meta").write_bytes(_pickled(meta, "python2"))
    s = cifar10(root=str(tmp_path), normalize="none")
    assert (len(s.train), len(s.val), s.test) == (20, 3, None)  # type: ignore[arg-type]
    assert s.train.tensors[1].tolist() == train_labels  # type: ignore[union-attr]
    x, y = s.val.tensors  # type: ignore[union-attr]
    assert y.tolist() == [3, 1, 4] and x[1, 2, 5, 7] == 1.0 and float(x.sum()) == 1.0
    assert s.info.input_shape == (3, 32, 32) and s.info.num_classes == 10
    carved = cifar10(root=str(tmp_path), val_split=5)
    assert (len(carved.train), len(carved.val), len(carved.test)) == (15, 5, 3)  # type: ignore[arg-type]


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("file", ["data_batch_1", "batches.meta"])
def test_a_cifar_file_that_calls_code_is_refused_without_running_it(
    tmp_path: Path, file: str
) -> None:
    """Only numpy's array reconstruction is admitted: a batch or meta file whose pickle calls
    os.system is refused before the call."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        _cifar_batch(folder / name, np.zeros((2, 3, 32, 32), np.uint8), [0, 1])
    marker = tmp_path / "code_ran"
    hostile = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1], "x": _RunsCode(marker)}
    if file == "batches.meta":
        hostile = {"label_names": [_RunsCode(marker)]}
    (folder / file).write_bytes(pickle.dumps(hostile))
    with pytest.raises(UserError, match=r"it calls (posix|os)\.system, which a CIFAR file never"):
        cifar10(root=str(tmp_path))
    assert not marker.exists()


def test_cifar10_missing_names_the_files_expected(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"cifar-10-batches-py/data_batch_1"):
        cifar10(root=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# image folders
# ---------------------------------------------------------------------------------------------


def test_image_folder_splits_classes_and_modes(tmp_path: Path) -> None:
    image_tree(tmp_path / "train", classes=3, per_class=10)
    image_tree(tmp_path / "val", classes=3, per_class=4, seed=1)
    first = next((tmp_path / "train" / "class_0").glob("*.jpg"))
    (tmp_path / "train" / "class_0" / f"._{first.name}").write_bytes(b"AppleDouble")  # macOS's
    (tmp_path / "train" / "class_1" / ".ipynb_checkpoints").mkdir()
    shutil.copy(first, tmp_path / "train" / "class_1" / ".ipynb_checkpoints" / "copy.jpg")
    s = image_folder(root=str(tmp_path), image_size=16)
    assert (len(s.train), len(s.val), s.test) == (30, 12, None)  # type: ignore[arg-type]
    assert s.info.classes == ("class_0", "class_1", "class_2") and s.info.input_shape == (3, 16, 16)
    labels = sorted(int(s.val[i][1]) for i in range(12))  # type: ignore[index]
    assert labels == [0] * 4 + [1] * 4 + [2] * 4
    for i in range(10):  # every mode (grey, CMYK, RGBA, palette) comes out as RGB uint8
        x, _ = s.train[i]  # type: ignore[index]
        assert x.shape == (3, 16, 16) and x.dtype == torch.uint8
    one = image_folder(root=str(tmp_path / "train"), val_split=0.2, channels=1, image_size=8)
    assert (len(one.train), len(one.val)) == (24, 6)  # type: ignore[arg-type]
    assert one.train[0][0].shape == (1, 8, 8)  # type: ignore[index]


def test_a_class_folder_that_is_a_broken_link_is_refused_not_left_out(tmp_path: Path) -> None:
    """A scan that passed over it would train on the other classes, labelled differently."""
    image_tree(tmp_path / "pets", classes=2, per_class=2)
    (tmp_path / "pets" / "class_2").symlink_to(tmp_path / "unmounted" / "cats")
    (tmp_path / "pets" / ".cache").symlink_to(tmp_path / "gone")  # hidden: not a class anyway
    with pytest.raises(UserError, match=r"pets/class_2 is a broken symbolic link \(to .*cats\)"):
        scan_folder(tmp_path / "pets", EXTENSIONS)
    (tmp_path / "pets" / "class_2").unlink()
    classes, samples = scan_folder(tmp_path / "pets", EXTENSIONS)
    assert classes == ["class_0", "class_1"] and len(samples) == 4


def test_an_image_that_is_a_broken_link_is_refused_or_skipped_as_corrupt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An image file that links to nothing (an unmounted disk) was left out without a word: the
    scan names it and its target (on_corrupt=error), or leaves it out with one warning (skip)."""
    image_tree(tmp_path / "pets", classes=2, per_class=3)
    (tmp_path / "pets" / "class_1" / "gone.jpg").symlink_to(tmp_path / "unmounted" / "x.jpg")
    (tmp_path / "pets" / "class_1" / "._gone.jpg").symlink_to(tmp_path / "gone")  # hidden
    with pytest.raises(
        UserError, match=r"class_1/gone.jpg is a broken symbolic link \(to .*x.jpg\)"
    ):
        image_folder(root=str(tmp_path / "pets"), val=None, image_size=8)
    with caplog.at_level(logging.WARNING, logger="expctl"):
        s = image_folder(root=str(tmp_path / "pets"), val=None, image_size=8, on_corrupt="skip")
    assert len(s.train) == 6  # type: ignore[arg-type]
    said = [m for m in caplog.messages if "broken symbolic link" in m]
    assert len(said) == 1 and "class_1/gone.jpg (to " in said[0] and "._gone" not in said[0], said


def test_linked_folders_inside_a_class_are_read_once_and_a_link_loop_ends(tmp_path: Path) -> None:
    """A class assembled from linked folders (as torchvision's ImageFolder follows them): their
    images are samples. A folder reached twice, or a link back up the tree, is read once. A
    class folder that links back up the tree, or to another class's folder, is refused."""
    image_tree(tmp_path / "pets", classes=2, per_class=3)
    image_tree(tmp_path / "more", classes=1, per_class=4)
    cls = tmp_path / "pets" / "class_1"
    (cls / "more").symlink_to(tmp_path / "more" / "class_0", target_is_directory=True)
    (cls / "again").symlink_to(tmp_path / "more" / "class_0", target_is_directory=True)
    (cls / "loop").symlink_to(tmp_path / "pets", target_is_directory=True)
    s = image_folder(root=str(tmp_path / "pets"), val=None, image_size=8)
    samples = s.train.samples  # type: ignore[attr-defined]
    assert len(samples) == 3 + 3 + 4
    assert len({Path(p).resolve() for p, _ in samples}) == len(samples), "each image once"
    linked = [p for p, label in samples if label == 1 and ("/more/" in p or "/again/" in p)]
    assert len(linked) == 4
    (tmp_path / "pets" / "loop").symlink_to(tmp_path / "pets", target_is_directory=True)
    with pytest.raises(UserError, match=r"class folder .*pets/loop leads to .*a link back up"):
        image_folder(root=str(tmp_path / "pets"), val=None, image_size=8)
    (tmp_path / "pets" / "loop").unlink()
    (tmp_path / "pets" / "twin").symlink_to(cls, target_is_directory=True)
    with pytest.raises(UserError, match="class folders class_1 and twin .* are the same folder"):
        image_folder(root=str(tmp_path / "pets"), val=None, image_size=8)
    (tmp_path / "pets" / "twin").unlink()
    (cls / "dogs").symlink_to(tmp_path / "pets" / "class_0", target_is_directory=True)
    with pytest.raises(UserError, match=r"class_1/dogs \(in class folder class_1\) leads to"):
        image_folder(root=str(tmp_path / "pets"), val=None, image_size=8)


def test_mean_and_std_normalise_whatever_normalize_says_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`expctl eval` of a normalize=computed run on other data passes the logged mean/std (the
    README says so): they win over data.normalize, and the log says which normalised."""
    image_tree(tmp_path, classes=2, per_class=4)
    with caplog.at_level(logging.INFO, logger="expctl"):
        s = image_folder(
            root=str(tmp_path), val=None, image_size=8, normalize="computed", mean=[0.5] * 3,
            std=[0.25] * 3,
        )  # fmt: skip
    assert s.train.normalize.mean.flatten().tolist() == [0.5 * 255] * 3  # type: ignore[attr-defined]
    assert any("data.normalize=computed is not used" in m for m in caplog.messages)


def test_val_split_is_an_integer_count_or_a_float_fraction(tmp_path: Path) -> None:
    """1.0 used to hold out one sample, 2.0 two: a float is a fraction, in (0, 1), only."""
    image_tree(tmp_path, classes=2, per_class=5)
    assert len(image_folder(root=str(tmp_path), val_split=1, image_size=8).val) == 1  # type: ignore[arg-type]
    assert len(image_folder(root=str(tmp_path), val_split=0.2, image_size=8).val) == 2  # type: ignore[arg-type]
    for bad in (1.0, 2.0, 1.5, -1, -0.5):
        with pytest.raises(UserError, match=f"data.val_split={bad!r}: neither a count"):
            image_folder(root=str(tmp_path), val_split=bad, image_size=8)
    assert [len(part) for part in carve(10, 3)] == [7, 3]
    for n in (2, 10, 60000):  # the hint's bounds are fractions it accepts (8.3e-06 was not)
        with pytest.raises(UserError, match="or a fraction from") as said:
            carve(n, 0.5 / n)
        low, high = (
            float(v) for v in said.value.hint.split("from ")[1].split(" (")[0].split(" to ")
        )
        assert all(0 < len(part) < n for v in (low, high) for part in carve(n, v))
    with pytest.raises(UserError, match="data.val_split=3.0: neither a count"):
        carve(10, 3.0)  # the in-memory datasets (fashion_mnist, cifar, arrays) carve too
    frozen = {"data": {"name": "fashion_mnist", "val_split": 5000.0}}  # typed float before
    legacy_counts(frozen)
    assert frozen["data"]["val_split"] == 5000 and isinstance(frozen["data"]["val_split"], int)


def test_image_folder_normalises_on_the_device_with_computed_stats(tmp_path: Path) -> None:
    image_tree(tmp_path, classes=2, per_class=8)
    s = image_folder(root=str(tmp_path), val_split=4, normalize="computed", image_size=12)
    x, y = s.val.on_device(s.val.collate([s.val[i] for i in range(4)]), CPU)  # type: ignore[union-attr]
    assert x.dtype == torch.float32 and x.shape == (4, 3, 12, 12) and y.shape == (4,)
    assert abs(float(x.mean())) < 1.0


def test_computed_statistics_are_the_pixels_and_skip_corrupt_files_when_told(
    tmp_path: Path,
) -> None:
    """normalize=computed: the training images' per-channel mean and std (summed one image at
    a time), and a corrupt file among them is skipped with on_corrupt=skip (it was named and
    the run refused, whatever on_corrupt said)."""
    image_tree(tmp_path, classes=2, per_class=3)
    samples = image_folder(root=str(tmp_path), val=None, image_size=8).train.samples  # type: ignore[attr-defined]
    plain = ImageFiles(samples, 8, 3, False, "imagenet", Normalized([0.0], [1.0]))  # eval's crop
    x = torch.stack([plain[i][0] for i in range(6)]).double() / 255
    s = image_folder(root=str(tmp_path), val=None, image_size=8, normalize="computed")
    norm = s.train.normalize  # type: ignore[attr-defined]
    # Normalized keeps them on the uint8 scale
    assert torch.allclose(norm.mean.flatten().double() / 255, x.mean(dim=(0, 2, 3)), atol=1e-6)
    assert torch.allclose(norm.std.flatten().double() / 255, x.std(dim=(0, 2, 3)), rtol=1e-2)
    bad = tmp_path / "class_1" / "img_001.jpg"
    bad.write_bytes(bad.read_bytes()[:60])
    with pytest.raises(CorruptImage, match=r"class_1/img_001.jpg cannot be decoded"):
        image_folder(root=str(tmp_path), val=None, image_size=8, normalize="computed")
    skip = image_folder(
        root=str(tmp_path), val=None, image_size=8, normalize="computed", on_corrupt="skip"
    )
    assert len(skip.train) == 6  # type: ignore[arg-type]


def test_a_corrupt_image_is_named_or_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    image_tree(tmp_path, classes=2, per_class=3)
    bad = tmp_path / "class_1" / "img_001.jpg"  # exists: JPEG, cut short
    bad.write_bytes(bad.read_bytes()[:60])
    s = image_folder(root=str(tmp_path), val=None, image_size=8)
    index = [p for p, _ in s.train.samples].index(str(bad))  # type: ignore[attr-defined]
    with pytest.raises(CorruptImage, match=r"class_1/img_001.jpg cannot be decoded"):
        s.train[index]  # type: ignore[index]
    skip = image_folder(root=str(tmp_path), val=None, image_size=8, on_corrupt="skip")
    with caplog.at_level(logging.WARNING, logger="expctl"):
        for _epoch in range(2):
            batch = skip.train.collate([skip.train[i] for i in range(len(skip.train))])  # type: ignore[union-attr, arg-type]
            assert batch[0].shape[0] == 5  # 6 files, the corrupt one dropped
    said = [m for m in caplog.messages if "skipped corrupt image" in m]
    assert len(said) == 1 and "img_001.jpg" in said[0], said  # once, not every epoch
    # every image of a batch corrupt: it cannot be dropped (every rank trains on each batch)
    with pytest.raises(CorruptImage, match=r"every image of a batch \(2\) is corrupt") as e:
        skip.train.collate([None, None])  # type: ignore[union-attr]
    assert (e.value.hint or "").startswith("remove or replace those files; where good images")


def test_a_corrupt_image_met_in_a_worker_keeps_its_one_line_message(tmp_path: Path) -> None:
    image_tree(tmp_path, classes=2, per_class=2)
    for p in tmp_path.rglob("*.*"):
        p.write_bytes(b"not an image")
    s = image_folder(root=str(tmp_path), val=None, image_size=8)
    with pytest.raises(CorruptImage) as e:
        list(TrainBatches(s.train, 2, 0, 1, 0, CPU, Loading(1)).epoch(0))
    assert "Traceback" not in str(e.value) and "cannot be decoded" in str(e.value)
    assert len(str(e.value).splitlines()) == 2


@pytest.mark.slow
def test_image_folder_trains_ddp_with_workers_bitwise_equal_to_none(tmp_path: Path) -> None:
    """2 DDP workers on a folder of JPEGs and PNGs: num_workers=2 and num_workers=0 give the same
    weights and metrics, bit for bit."""
    image_tree(tmp_path / "imgs" / "train", classes=3, per_class=70)  # 210 JPEGs and PNGs
    image_tree(tmp_path / "imgs" / "val", classes=3, per_class=6, seed=1)
    results = []
    for workers in (2, 0):
        run = tmp_path / f"run{workers}"
        expctl(
            "run", "model=cnn", "model.width=8", "data=image_folder", "data.root=imgs",
            "data.image_size=16", "data.batch_size=16", f"data.num_workers={workers}",
            "launcher=local", "launcher.nproc=2", "train.max_epochs=2", "sched=none",
            f"run.dir={run}", cwd=tmp_path,
        )  # fmt: skip
        result = json.loads((run / "result.json").read_text())
        state = torch.load(sorted((run / "checkpoints").glob("*.pt"))[-1], weights_only=False)
        results.append((result, state["models"]["model"]))
        log = (run / "train.log").read_text().splitlines()[0]
        assert f"streamed by {workers} DataLoader worker(s) per rank" in log
        assert "decoded by Pillow in the workers; data.decode=auto: no CUDA device" in log
    (r2, w2), (r0, w0) = results
    assert {k: v for k, v in r2.items() if not k.startswith("time/")} == {
        k: v for k, v in r0.items() if not k.startswith("time/")
    }
    assert all(torch.equal(w2[k], w0[k]) for k in w0)


def test_a_validation_split_smaller_than_the_ranks_is_scored_not_hung(tmp_path: Path) -> None:
    """data.val_split=1 with 2 ranks: rank 1 has no validation sample; it still names the metrics
    rank 0 reduces (it hung in the all-reduce, rank 0's sums against none). Streamed with a
    worker, and in memory."""
    image_tree(tmp_path / "imgs", classes=2, per_class=8)
    for data in (
        ["data=image_folder", "data.root=imgs", "data.image_size=16", "data.num_workers=1"],
        ["data=synthetic", "data.shape=[1,8,8]", "data.num_samples=32", "data.val_samples=1"],
    ):
        run = tmp_path / data[0].split("=")[1]
        expctl(
            "run", "model=mlp", *data, *(["data.val_split=1"] if "imgs" in data[1] else []),
            "data.batch_size=4", "launcher=local", "launcher.nproc=2", "train.max_epochs=1",
            "sched=none", f"run.dir={run}", cwd=tmp_path, timeout=180,
        )  # fmt: skip
        result = json.loads((run / "result.json").read_text())
        assert result["val/acc"] in (0.0, 1.0), result  # one sample, counted once


def test_a_checkpoint_refuses_data_that_changed_under_it(tmp_path: Path) -> None:
    """Resuming on a folder that gained images since (every later epoch dealt differently), or
    scoring on folders whose class names differ (outputs read as other classes): exit 2,
    naming the change, nothing written."""
    image_tree(tmp_path / "imgs", classes=2, per_class=8)
    run = tmp_path / "run"
    args = ["run", "model=mlp", "data=image_folder", "data.root=imgs", "data.image_size=8"]
    args += ["data.val_split=4", "data.batch_size=4", "sched=none", f"run.dir={run}"]
    expctl(*args, "train.max_epochs=1", cwd=tmp_path)
    image_tree(tmp_path / "more", classes=2, per_class=2, seed=3)
    for p in (tmp_path / "more").rglob("*.*"):
        p.rename(tmp_path / "imgs" / p.parent.name / f"new_{p.name}")
    rows = (run / "metrics.jsonl").read_bytes()
    grown = expctl(*args, "train.max_epochs=2", cwd=tmp_path, check=False)
    assert grown.returncode == 2, grown.stderr
    assert "trained on 12 training samples; this data has 16" in grown.stderr, grown.stderr
    assert "checkpoint.init=" in grown.stderr and (run / "metrics.jsonl").read_bytes() == rows
    renamed = tmp_path / "renamed"
    shutil.copytree(tmp_path / "imgs", renamed)
    (renamed / "class_1").rename(renamed / "zebra")
    score = expctl("eval", str(run), f"data.root={renamed}", cwd=tmp_path, check=False)
    assert score.returncode == 2 and "this data's are class_0, zebra" in score.stderr, score.stderr
    assert not (run / "eval").exists() or not any((run / "eval").iterdir())


@pytest.mark.parametrize("validate", ["train.val_every_steps=3", "train.val_every=2"])
def test_streamed_images_resumed_mid_epoch_with_validations_between_train_as_one_run(
    tmp_path: Path, validate: str
) -> None:
    """Training batches are read by passes of the workers taken over by validations (every 3
    steps, epochs of 7), or running on through two epochs (a validation every 2): stopped at
    step 8 (inside either) and continued to 16, the run ends with the weights and metrics of one
    that went to 16 at once."""
    from expctl.api import run as train  # noqa: PLC0415

    image_tree(tmp_path / "imgs" / "train", classes=3, per_class=20)  # 60 files: 7 batches of 8
    image_tree(tmp_path / "imgs" / "val", classes=3, per_class=3, seed=1)
    args = [
        "model=cnn", "model.width=8", "data=image_folder", f"data.root={tmp_path / 'imgs'}",
        "data.image_size=16", "data.batch_size=8", "data.num_workers=1", "sched=none",
        "train.device=cpu", validate, "train.log_every=1",
    ]  # fmt: skip
    whole = train(None, [*args, "train.max_steps=16", f"run.dir={tmp_path / 'whole'}"]).metrics
    train(None, [*args, "train.max_steps=8", f"run.dir={tmp_path / 'parts'}"])
    parts = train(None, [*args, "train.max_steps=16", f"run.dir={tmp_path / 'parts'}"]).metrics
    assert whole["epoch"] == parts["epoch"] == 3 and whole["step"] == parts["step"] == 16
    assert {k: v for k, v in whole.items() if not k.startswith("time/")} == {
        k: v for k, v in parts.items() if not k.startswith("time/")
    }
    weights = [
        torch.load(sorted((tmp_path / d / "checkpoints").glob("*.pt"))[-1], weights_only=False)
        for d in ("whole", "parts")
    ]
    a, b = (w["models"]["model"] for w in weights)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------
# arrays
# ---------------------------------------------------------------------------------------------


def test_arrays_from_a_csv_with_words_as_classes(tmp_path: Path) -> None:
    rows = ["height,weight,species"] + [
        f"{10 + i % 7},{3.5 * (i % 3) + i % 5},{['cat', 'dog', 'eel'][i % 3]}" for i in range(30)
    ]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    s = arrays(train=str(tmp_path / "t.csv"), val_split=0.2)
    assert s.info.classes == ("cat", "dog", "eel") and s.info.input_shape == (2,)
    assert (len(s.train), len(s.val)) == (24, 6)  # type: ignore[arg-type]
    x = torch.cat([s.train.tensors[0], s.val.tensors[0]])  # type: ignore[union-attr]
    assert x.shape == (30, 2) and abs(float(s.train.tensors[0].mean())) < 1e-5  # train's stats  # type: ignore[union-attr]
    y = torch.cat([s.train.tensors[1], s.val.tensors[1]]).tolist()  # type: ignore[union-attr]
    assert sorted(y) == sorted(i % 3 for i in range(30))
    pick = arrays(train=str(tmp_path / "t.csv"), target="height", features=["weight"], val_split=3)
    assert pick.info.input_shape == (1,) and pick.info.num_classes == 17


@pytest.mark.parametrize("big", [1e38, 1e300])
def test_arrays_standardise_features_beyond_what_float32_sums(tmp_path: Path, big: float) -> None:
    """Features up to 2e38 (float32 ends at 3.4e38; their sum overflowed it, the loss was NaN
    and the hint said to lower optim.lr), or 2e300 (whose square overflows float64):
    standardised in float64 and by the column's largest value, they train as any other."""
    rows = ["a,b,y"] + [f"{(i % 3) * big},{i % 5},{i % 2}" for i in range(40)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    x = arrays(train=str(tmp_path / "t.csv"), val_split=0.25).train.tensors[0]  # type: ignore[attr-defined]
    assert torch.isfinite(x).all() and float(x[:, 0].std(unbiased=False)) == pytest.approx(1)


@pytest.mark.slow
def test_arrays_npz_regression_trains_a_linear_model(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype(np.float32)
    y = x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.01 * rng.normal(size=600)
    np.savez(tmp_path / "d.npz", x_train=x[:500], y_train=y[:500], x_val=x[500:], y_val=y[500:])
    expctl(
        "run", "data=arrays", "data.train=d.npz", "data.task=regression", "model=linear",
        "loss=mse", "optim=adam", "optim.lr=0.05", "sched=none", "data.batch_size=50",
        "train.max_epochs=15", "run.dir=reg", cwd=tmp_path,
    )  # fmt: skip
    metrics = json.loads((tmp_path / "reg" / "result.json").read_text())
    assert metrics["val/loss"] < 0.05, metrics  # the variance of y is ~14.3
