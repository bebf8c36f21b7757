"""torchvision's offline datasets by name, read from the files torchvision lays out under
``data.root`` (nothing downloads unless ``data.download=true``).

Small ones are held in memory as tensors: CIFAR-10/100 (read from their python pickles), SVHN,
STL10 and USPS (torchvision's readers). Larger ones (Flowers102, Food101, DTD, ...) are streamed
from their image files by DataLoader workers through the image_folder transforms (see
`expctl.builtin.datasets.imagefiles`).
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets import preflight
from expctl.builtin.datasets.files import in_memory_factory, not_found, root_of, root_text
from expctl.builtin.datasets.imagefiles import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalized,
    PilTransform,
)
from expctl.builtin.datasets.tensors import with_val
from expctl.errors import UserError
from expctl.registry import register

# ---------------------------------------------------------------------------------------------
# CIFAR: the python pickles of cifar-10-batches-py / cifar-100-python
# ---------------------------------------------------------------------------------------------

CIFAR_MAX = 60000  # images a CIFAR folder may hold in all
_NOT_CIFAR = (
    OSError,
    pickle.UnpicklingError,
    EOFError,
    KeyError,
    TypeError,
    ValueError,
    RuntimeError,
    MemoryError,  # an array shape that no file of 60000 images has
)


# All that a CIFAR file under data.root may call as it is unpickled: numpy's reconstruction of
# an ndarray (numpy 1's names, in the published files, and numpy 2's). The rest of a batch
# (dicts, lists, str, bytes, numbers) needs no callable at all.
CIFAR_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),  # protocol 5
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR file without running its code: any other callable is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"it calls {module}.{name}, which a CIFAR file never does")
        return super().find_class(module, name)


def _unpickle_cifar(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        entry = _CifarUnpickler(f, encoding="latin1").load()
    if not isinstance(entry, dict):
        raise TypeError(f"it holds a {type(entry).__name__}, not a dict")
    return entry


def _read_cifar_batch(path: Path, label_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One CIFAR pickle: uint8 images (N, 3, 32, 32) and labels."""
    try:
        entry = _unpickle_cifar(path)
        data = torch.as_tensor(entry["data"], dtype=torch.uint8).reshape(-1, 3, 32, 32)
        labels = torch.as_tensor(entry[label_key], dtype=torch.long)
    except _NOT_CIFAR as e:
        raise UserError(
            f"data file {path} is not a CIFAR batch ({type(e).__name__}: {str(e)[:80]})",
            "re-extract the dataset's archive, or set data.download=true",
        ) from None
    if len(data) != len(labels) or len(data) > CIFAR_MAX:
        raise UserError(
            f"data file {path} holds {len(data)} images and {len(labels)} labels", "re-extract it"
        )
    return data, labels


def _cifar_reader(name: str) -> Any:
    """The `read` of cifar10 or cifar100 (`files.in_memory_factory`)."""

    def read(root: str | None, download: bool) -> tuple[Any, ...]:
        folder, train_files, test_files, label_key, meta, names_key = preflight.CIFAR[name]
        if download:
            import torchvision.datasets as tvd  # noqa: PLC0415 - torchvision off other datasets

            getattr(tvd, name.upper())(str(root_of(root)), download=True)
        preflight.require(name, root, preflight.cifar_paths(name, root))
        base = root_of(root) / folder

        def batches(files: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
            parts = [_read_cifar_batch(base / f, label_key) for f in files]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

        classes = None
        if (base / meta).exists():
            try:
                classes = _unpickle_cifar(base / meta).get(names_key)
            except _NOT_CIFAR as e:
                raise UserError(
                    f"data file {base / meta} is not CIFAR's class names ({type(e).__name__}: "
                    f"{str(e)[:80]})",
                    "re-extract the dataset's archive, or set data.download=true",
                ) from None
        num = 10 if name == "cifar10" else 100
        return batches(train_files), batches(test_files), classes, num

    return read


cifar10 = register("datasets", check=functools.partial(preflight.cifar, "cifar10"))(
    in_memory_factory(
        "cifar10",
        _cifar_reader("cifar10"),
        """CIFAR-10 (50k/10k 32x32 colour images, 10 classes) from ROOT/cifar-10-batches-py, in memory.

    Without `val_split` the test images validate; with it (a count or a fraction) part of train
    validates and the test images are scored once, at the end.""",
    )
)
cifar100 = register("datasets", check=functools.partial(preflight.cifar, "cifar100"))(
    in_memory_factory(
        "cifar100",
        _cifar_reader("cifar100"),
        "CIFAR-100 (50k/10k 32x32 colour images, 100 fine classes) from ROOT/cifar-100-python.",
    )
)


# ---------------------------------------------------------------------------------------------
# torchvision's own readers
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A torchvision dataset class and how its files and splits are laid out."""

    cls: str  # torchvision.datasets.<cls>
    expected: str  # what data.root must hold, for the missing-files error
    train: dict[str, Any]  # constructor arguments of each split
    test: dict[str, Any] | None = None
    val: dict[str, Any] | None = None
    in_memory: bool = False  # its .data / .labels are arrays: held as tensors
    val_split: int | float = 0  # default carve, for datasets without a test split


def _open(
    name: str, src: Source, root: str | None, download: bool, split: dict[str, Any], **kw: Any
) -> Any:
    import torchvision.datasets as tvd  # noqa: PLC0415 - torchvision off other datasets

    try:
        return getattr(tvd, src.cls)(str(root_of(root)), download=download, **split, **kw)
    except (RuntimeError, FileNotFoundError) as e:
        if (
            isinstance(e, RuntimeError)
            and "not found" not in str(e).lower()
            and "download" not in str(e)
        ):
            raise
        raise not_found(name, root_text(root), src.expected) from None
    except ImportError as e:
        raise UserError(
            f"data={name}: torchvision's {src.cls} needs the package '{e.name}'",
            f"pip install {e.name}",
        ) from None


def _array_set(ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The images (N, C, H, W) uint8 and labels of a torchvision dataset held as arrays."""
    data = torch.as_tensor(ds.data)
    if data.dim() == 3:
        data = data.unsqueeze(1)
    labels = getattr(ds, "labels", None)
    return data, torch.as_tensor(labels if labels is not None else ds.targets)


def _streamed_sets(
    name: str, src: Source, root: str | None, download: bool, size: int, channels: int, preset: str
) -> dict[str, Dataset[Any] | None]:
    sets: dict[str, Dataset[Any] | None] = {}
    for part, split in (("train", src.train), ("val", src.val), ("test", src.test)):
        if split is None:
            sets[part] = None
            continue
        transform = PilTransform(size, channels, part == "train", preset)
        sets[part] = _Uint8Images(_open(name, src, root, download, split, transform=transform))
    plain = PilTransform(size, channels, False, preset)
    sets["train_view"] = _Uint8Images(_open(name, src, root, download, src.train, transform=plain))
    return sets


class _Uint8Images(Dataset[Any]):
    """A torchvision dataset of transformed images, normalised on the device (ImageNet stats)."""

    def __init__(self, ds: Any) -> None:
        self.ds, self.normalize = ds, Normalized(IMAGENET_MEAN, IMAGENET_STD)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]

    def on_device(self, batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        x = x.to(device, non_blocking=True)
        if x.shape[1] == 1:
            return (x.float() / 255 - 0.449) / 0.226, y.to(device, non_blocking=True)
        return self.normalize(x), y.to(device, non_blocking=True)


def _factory(name: str, src: Source, classes: int) -> Any:
    """The registered factory of one torchvision dataset: in memory, or streamed from files."""

    def read(root: str | None, download: bool) -> tuple[Any, ...]:
        train = _open(name, src, root, download, src.train)
        test = _open(name, src, root, download, src.test) if src.test else None
        return (
            _array_set(train),
            _array_set(test) if test is not None else None,
            getattr(train, "classes", None),
            classes,
        )

    def streamed_set(
        root: str | None = None,
        download: bool = False,
        val_split: int | float = src.val_split,
        image_size: int = 224,
        preset: str = "imagenet",
    ) -> Splits:
        if src.val is None and src.test is None and not val_split:
            raise UserError(
                f"data={name} has a single split: set data.val_split (a count or a fraction)",
                "e.g. data.val_split=0.1",
            )
        preflight.check_choices(preset=(preset, preflight.PRESETS))
        sets = _streamed_sets(name, src, root, download, image_size, 3, preset)
        first = sets["train"]
        assert first is not None
        info = DataInfo((3, image_size, image_size), classes, _classes(first))
        return with_val(first, sets["test"], info, val_split, sets["val"], sets["train_view"])

    how = "held in memory" if src.in_memory else "streamed, ImageNet-normalised"
    doc = f"torchvision's {src.cls}, {how}: ROOT holds {src.expected}; {classes} classes."
    if src.in_memory:
        return in_memory_factory(name, read, doc)
    streamed_set.__name__ = name
    streamed_set.__doc__ = doc
    return streamed_set


def _classes(ds: Any) -> tuple[str, ...] | None:
    names = getattr(ds.ds, "classes", None)
    return tuple(map(str, names)) if names else None


SOURCES: dict[str, tuple[Source, int]] = {
    "svhn": (
        Source("SVHN", "train_32x32.mat and test_32x32.mat (needs scipy)", {"split": "train"},
               {"split": "test"}, in_memory=True),
        10,
    ),
    "stl10": (
        Source("STL10", "stl10_binary/ with train_X.bin, train_y.bin, test_X.bin, test_y.bin",
               {"split": "train"}, {"split": "test"}, in_memory=True),
        10,
    ),
    "usps": (
        Source("USPS", "usps.bz2 and usps.t.bz2", {"train": True}, {"train": False}, in_memory=True),
        10,
    ),
    "flowers102": (
        Source("Flowers102", "flowers-102/ with jpg/, imagelabels.mat, setid.mat (needs scipy)",
               {"split": "train"}, {"split": "test"}, {"split": "val"}),
        102,
    ),
    "food101": (
        Source("Food101", "food-101/ with images/ and meta/", {"split": "train"}, {"split": "test"}),
        101,
    ),
    "dtd": (
        Source("DTD", "dtd/dtd/ with images/ and labels/", {"split": "train"}, {"split": "test"},
               {"split": "val"}),
        47,
    ),
    "oxford_iiit_pet": (
        Source("OxfordIIITPet", "oxford-iiit-pet/ with images/ and annotations/",
               {"split": "trainval"}, {"split": "test"}),
        37,
    ),
    "gtsrb": (
        Source("GTSRB", "gtsrb/GTSRB/ with Training/ and Final_Test/", {"split": "train"},
               {"split": "test"}),
        43,
    ),
    "fgvc_aircraft": (
        Source("FGVCAircraft", "fgvc-aircraft-2013b/ with data/images/", {"split": "train"},
               {"split": "test"}, {"split": "val"}),
        100,
    ),
    "country211": (
        Source("Country211", "country211/ with train/, valid/, test/", {"split": "train"},
               {"split": "test"}, {"split": "valid"}),
        211,
    ),
    "eurosat": (Source("EuroSAT", "eurosat/2750/ class folders", {}, val_split=0.2), 10),
    "sun397": (Source("SUN397", "SUN397/ with ClassName.txt", {}, val_split=0.2), 397),
    "imagenette": (
        Source("Imagenette", "imagenette2/ with train/ and val/", {"split": "train"},
               {"split": "val"}),
        10,
    ),
}  # fmt: skip

for _name, (_src, _classes_n) in SOURCES.items():
    register("datasets", _name, check=functools.partial(preflight.source, _name, _src.expected))(
        _factory(_name, _src, _classes_n)
    )
