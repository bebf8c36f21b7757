"""The MNIST family, held in memory: Fashion-MNIST (the embedded default, read from Debian's
``dataset-fashion-mnist`` files or torchvision's layout), MNIST and KMNIST from their IDX files
(plain or .gz), EMNIST and QMNIST through torchvision's readers.

Importing this module loads no torch (the factories do): `expctl show` runs the pre-flight
check of the default dataset, which finds its files, without it."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expctl.builtin.datasets.files import in_memory_factory, not_found, root_of, root_text
from expctl.cache import cache_dir, cache_write
from expctl.errors import UserError
from expctl.registry import register

if TYPE_CHECKING:
    import torch

IDX_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "val_x": "t10k-images-idx3-ubyte",
    "val_y": "t10k-labels-idx1-ubyte",
}
IDX_SHAPES = {  # what each file's IDX header may declare: (images or labels, rows, cols)
    "train_x": (60000, 28, 28),
    "train_y": (60000,),
    "val_x": (10000, 28, 28),
    "val_y": (10000,),
}
FASHION_DIRS = ("/usr/share/datasets/fashion-mnist", "data/fashion-mnist", "data")
FASHION_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
_TORCHVISION_FOLDER = {"fashion_mnist": "FashionMNIST", "mnist": "MNIST", "kmnist": "KMNIST"}


def find_idx(name: str, root: str | None, download: bool = False) -> dict[str, Path]:
    """The four IDX files of `name` (plain or .gz) in `root`, `root/<Name>/raw` or, for
    Fashion-MNIST without a root, Debian's and the usual folders; fetched when `download`."""
    folder_name = _TORCHVISION_FOLDER[name]
    default = FASHION_DIRS if name == "fashion_mnist" else ("data",)
    roots = [Path(root).expanduser()] if root else [Path(d) for d in default]
    for folder in [c for r in roots for c in (r, r / folder_name / "raw")]:
        found = {}
        for key, stem in IDX_FILES.items():
            for file in (folder / stem, folder / f"{stem}.gz"):
                if file.is_file():
                    found[key] = file
                    break
        if len(found) == len(IDX_FILES):
            return found
    if download:
        import torchvision.datasets as tvd  # noqa: PLC0415 - torchvision off other datasets

        target = root_of(root)
        for train in (True, False):
            getattr(tvd, folder_name)(str(target), train=train, download=True)
        return find_idx(name, str(target))
    looked = ", ".join(str(r.absolute()) for r in roots)
    err = not_found(
        name,
        root_text(root) if root or len(roots) == 1 else f"{looked} (data.root=null: the defaults)",
        f"{IDX_FILES['train_x']}[.gz] and 3 more IDX files, there or in {folder_name}/raw",
    )
    if name == "fashion_mnist":
        err.hint = "install them with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), " + (
            err.hint or ""
        )
    raise err


def read_idx(path: Path, limit: tuple[int, ...]) -> torch.Tensor:
    """Read an IDX file of bytes (optionally gzipped) into a uint8 tensor: its header first,
    checked against `limit` (at most limit[0] items, each of exactly limit[1:]), then exactly
    the bytes it declares, so a small .gz that expands without end is never read whole.

    A .gz file is decompressed once: later reads take the decoded copy kept in the user's cache
    folder (`_decoded`), read and checked the same way (~0.2 s of Fashion-MNIST's start).
    """
    import torch  # noqa: PLC0415 - torch off `expctl show`: see the module docstring

    copy = _decoded(path) if path.suffix == ".gz" else None
    if copy is not None and copy.is_file():
        with contextlib.suppress(UserError):  # damaged or vanished: decode the .gz again
            dims, body = _read_idx(copy, limit)
            return torch.frombuffer(body, dtype=torch.uint8).view(*dims)
    dims, body = _read_idx(path, limit)
    if copy is not None:
        _keep(copy, dims, body)
    return torch.frombuffer(body, dtype=torch.uint8).view(*dims)


def _read_idx(path: Path, limit: tuple[int, ...]) -> tuple[list[int], bytearray]:
    """The dimensions an IDX file declares, and exactly the bytes it declares."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            dims = _idx_header(path, f.read(4 + 4 * len(limit)), limit)
            size = 1
            for d in dims:
                size *= d
            body, extra = f.read(size), f.read(1)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(
            f"data file {path} is unreadable or corrupt ({e})", "reinstall or re-download it"
        ) from None
    if len(body) != size or extra:
        raise UserError(
            f"data file {path} is truncated or corrupt ({len(body)}{'+' if extra else ''} bytes "
            f"of data, its header declares {size})",
            "reinstall or re-download it",
        )
    return dims, bytearray(body)


def _decoded(path: Path) -> Path | None:
    """Where the decoded copy of the .gz file `path` is kept: named after its path, size and
    modification time, so a changed file is decoded again."""
    try:
        where, st = path.resolve(), path.stat()
    except OSError:
        return None
    name = hashlib.sha256(str(where).encode()).hexdigest()[:16]
    stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"  # ctime: not settable
    version = hashlib.sha256(stamp.encode()).hexdigest()[:8]
    return cache_dir() / "data" / f"{where.stem}-{name}-{version}"


def _keep(copy: Path, dims: list[int], body: bytearray) -> None:
    """Store a decoded IDX file, replacing older versions of it (`cache.cache_write`)."""
    head = b"\x00\x00\x08" + bytes([len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
    stem = copy.name.rsplit("-", 1)[0]
    stale = list(copy.parent.glob(f"{stem}-*")) if copy.parent.is_dir() else []
    cache_write(copy, [head, bytes(body)], stale)


def _idx_header(path: Path, head: bytes, limit: tuple[int, ...]) -> list[int]:
    """The dimensions an IDX header declares, checked against `limit`."""
    ndim = len(limit)
    if len(head) != 4 + 4 * ndim or head[:3] != b"\x00\x00\x08" or head[3] != ndim:
        raise UserError(
            f"data file {path} is not an IDX file of {'images' if ndim == 3 else 'labels'} "
            "(bad header)",
            "reinstall or re-download it",
        )
    dims = [int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    if dims[0] > limit[0] or dims[1:] != list(limit[1:]):
        raise UserError(
            f"data file {path} is not an MNIST-style file: its header declares "
            f"{' x '.join(map(str, dims))}, expected {' x '.join(['N', *map(str, limit[1:])])} "
            f"with N <= {limit[0]}",
            "point data.root at the four IDX files (reinstall or re-download them)",
        )
    return dims


def _check_idx(name: str) -> Any:
    def check(root: str | None = None, download: bool = False, **_: Any) -> None:
        if not download:
            find_idx(name, root)

    return check


def _idx_reader(name: str) -> Any:
    """The `read` of fashion_mnist, mnist or kmnist (`files.in_memory_factory`)."""

    def read(root: str | None, download: bool) -> tuple[Any, Any, Any, int]:
        files = find_idx(name, root, download)
        arrays = {key: read_idx(files[key], IDX_SHAPES[key]) for key in IDX_FILES}
        for part in ("train", "val"):
            if len(arrays[f"{part}_x"]) != len(arrays[f"{part}_y"]):
                raise UserError(
                    f"data file {files[f'{part}_y']} has {len(arrays[f'{part}_y'])} labels for "
                    f"{len(arrays[f'{part}_x'])} images",
                    "reinstall it",
                )
        return (
            (arrays["train_x"].unsqueeze(1), arrays["train_y"]),
            (arrays["val_x"].unsqueeze(1), arrays["val_y"]),
            FASHION_CLASSES if name == "fashion_mnist" else None,
            10,
        )

    return read


fashion_mnist = register("datasets", check=_check_idx("fashion_mnist"))(
    in_memory_factory(
        "fashion_mnist",
        _idx_reader("fashion_mnist"),
        """Fashion-MNIST (60k/10k 28x28 grey images, 10 classes), held in memory.

    Without `val_split` the 10k test images validate; with it (a count or a fraction) that part
    of the training images validates and the test images are scored once, at the end (test/
    metrics, as a tuning study needs). `subset` keeps the first N training images.
    """,
    )
)
mnist = register("datasets", check=_check_idx("mnist"))(
    in_memory_factory(
        "mnist",
        _idx_reader("mnist"),
        "MNIST digits (60k/10k 28x28 grey images), from its IDX files; splits as fashion_mnist.",
    )
)
kmnist = register("datasets", check=_check_idx("kmnist"))(
    in_memory_factory(
        "kmnist",
        _idx_reader("kmnist"),
        "Kuzushiji-MNIST (60k/10k 28x28 grey images), from its IDX files; splits as fashion_mnist.",
    )
)


def _torchvision_mnist(cls_name: str, root: str | None, download: bool, **kw: Any) -> Any:
    """torchvision's EMNIST / QMNIST reader on ROOT/<Name>/raw, with a clear missing-files error."""
    import torchvision.datasets as tvd  # noqa: PLC0415 - torchvision off other datasets

    cls = getattr(tvd, cls_name)
    try:
        return [cls(str(root_of(root)), train=t, download=download, **kw) for t in (True, False)]
    except RuntimeError as e:
        if "not found" not in str(e).lower():
            raise
        raise not_found(
            cls_name.lower(),
            root_text(root),
            f"{cls_name}/raw/ as torchvision's {cls_name} writes it",
        ) from None


def _emnist(root: str | None, download: bool, split: str = "balanced") -> tuple[Any, ...]:
    train, test = _torchvision_mnist("EMNIST", root, download, split=split)
    return (
        (train.data.unsqueeze(1), train.targets),
        (test.data.unsqueeze(1), test.targets),
        train.classes,
        None,
    )


def _qmnist(root: str | None, download: bool) -> tuple[Any, ...]:
    train, test = _torchvision_mnist("QMNIST", root, download)
    return (
        (train.data.unsqueeze(1), train.targets[:, 0]),
        (test.data.unsqueeze(1), test.targets[:, 0]),
        None,
        10,
    )


emnist = register("datasets")(
    in_memory_factory(
        "emnist",
        _emnist,
        "EMNIST letters/digits (split: byclass, bymerge, balanced, letters, digits, mnist).",
    )
)
qmnist = register("datasets")(
    in_memory_factory(
        "qmnist", _qmnist, "QMNIST (MNIST's reconstructed test set: 60k/60k 28x28 grey digits)."
    )
)
