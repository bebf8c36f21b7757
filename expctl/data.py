"""Built-in datasets (Fashion-MNIST offline, synthetic) and the per-rank batch iterators.

A dataset factory returns `Splits`: train and val sets plus `DataInfo` (input shape, classes),
which fills a model's ``in_channels`` / ``num_classes`` when the config leaves them out.
In-memory sets (TensorDataset) are batched by indexing whole tensors, optionally on the GPU;
other datasets go through torch's DataLoader.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, TensorDataset

from expctl.errors import UserError
from expctl.registry import register


@dataclass(frozen=True)
class DataInfo:
    """What models need to know about the data."""

    input_shape: tuple[int, ...]
    num_classes: int | None = None  # classes, or outputs of a regression


@dataclass
class Splits:
    """Train, validation and (optionally) test sets of one dataset."""

    train: Dataset[Any]
    val: Dataset[Any] | None
    info: DataInfo
    test: Dataset[Any] | None = None  # evaluated once, at the end (test/ metrics)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST
# ---------------------------------------------------------------------------------------------

FASHION_DIRS = (
    "/usr/share/datasets/fashion-mnist",
    "data/fashion-mnist",
    "data/FashionMNIST/raw",
    "data",
)
FASHION_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "val_x": "t10k-images-idx3-ubyte",
    "val_y": "t10k-labels-idx1-ubyte",
}
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def _find_fashion(root: str | None, download: bool = False) -> dict[str, Path]:
    roots = [Path(root).expanduser()] if root else [Path(d) for d in FASHION_DIRS]
    candidates = []
    for r in roots:
        candidates += [r, r / "FashionMNIST" / "raw"]
    for folder in candidates:
        found = {}
        for key, stem in FASHION_FILES.items():
            for name in (stem, stem + ".gz"):
                if (folder / name).is_file():
                    found[key] = folder / name
                    break
        if len(found) == len(FASHION_FILES):
            return found
    if download:
        from torchvision.datasets import FashionMNIST

        target = Path(root or "data").expanduser()
        for train in (True, False):
            FashionMNIST(str(target), train=train, download=True)
        return _find_fashion(str(target), download=False)
    where = ", ".join(str(r) for r in roots)
    raise UserError(
        f"Fashion-MNIST not found in {where} (looked for {FASHION_FILES['train_x']}[.gz] and 3 more)",
        "install it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), point data.root "
        "at a folder holding the four files, or set data.download=true to fetch them (needs internet)",
    )


FASHION_SHAPES = {  # what each file's IDX header may declare: (images or labels, rows, cols)
    "train_x": (60000, 28, 28),
    "train_y": (60000,),
    "val_x": (10000, 28, 28),
    "val_y": (10000,),
}


def _read_idx(path: Path, limit: tuple[int, ...]) -> torch.Tensor:
    """Read an IDX file of bytes (optionally gzipped) into a uint8 tensor: its header first,
    checked against `limit` (at most limit[0] items, each of exactly limit[1:]), then exactly
    the bytes it declares, so a small .gz that expands without end is never read whole."""
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
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).view(*dims)


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
            f"data file {path} is not Fashion-MNIST's: its header declares "
            f"{' x '.join(map(str, dims))}, expected {' x '.join(['N', *map(str, limit[1:])])} "
            f"with N <= {limit[0]}",
            "point data.root at the four Fashion-MNIST files (reinstall or re-download them)",
        )
    return dims


def _check_fashion(
    root: str | None = None, download: bool = False, normalize: str = "standard", **_: Any
) -> None:
    if normalize not in ("standard", "tanh"):
        raise UserError(
            f"data.normalize: '{normalize}' is not one of: standard, tanh",
            "standard = mean/std, tanh = [-1, 1]",
        )
    if not download:
        _find_fashion(root)


@register("datasets", check=_check_fashion)
def fashion_mnist(
    root: str | None = None,
    download: bool = False,
    normalize: str = "standard",
    val_split: int = 0,
    subset: int | None = None,
) -> Splits:
    """Fashion-MNIST (60k/10k 28x28 grey images, 10 classes), normalised, held in memory.

    With `val_split` > 0 the last `val_split` training images validate and the 10k test images
    are only evaluated at the end (test/ metrics, as a tuning study needs); `subset` keeps the
    first N training images (quick runs).
    """
    files = _find_fashion(root, download)
    mean, std = (FASHION_MEAN, FASHION_STD) if normalize == "standard" else (0.5, 0.5)

    def images(key: str) -> torch.Tensor:
        x = _read_idx(files[key], FASHION_SHAPES[key]).unsqueeze(1).float().div_(255.0)
        return x.sub_(mean).div_(std)

    def labels(key: str) -> torch.Tensor:
        return _read_idx(files[key], FASHION_SHAPES[key]).long()

    train_x, val_x = images("train_x"), images("val_x")
    train_y, val_y = labels("train_y"), labels("val_y")
    for x, y, key in ((train_x, train_y, "train_y"), (val_x, val_y, "val_y")):
        if len(x) != len(y):
            raise UserError(
                f"data file {files[key]} has {len(y)} labels for {len(x)} images", "reinstall it"
            )
    info = DataInfo((1, 28, 28), 10)
    if not 0 <= val_split < len(train_x) - 1:
        raise UserError(
            f"data.val_split={val_split} must be in [0, {len(train_x) - 1})", "e.g. 5000"
        )
    test = None
    if val_split:
        test = TensorDataset(val_x, val_y)
        val_x, val_y = train_x[-val_split:], train_y[-val_split:]
        train_x, train_y = train_x[:-val_split], train_y[:-val_split]
    if subset is not None:
        train_x, train_y = train_x[:subset], train_y[:subset]
    return Splits(TensorDataset(train_x, train_y), TensorDataset(val_x, val_y), info, test)


# ---------------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------------


@register("datasets")
def synthetic(
    task: str = "classification",
    shape: Sequence[int] = (3, 32, 32),
    num_classes: int = 10,
    num_samples: int = 4096,
    val_samples: int = 1024,
    noise: float = 0.1,
    seed: int = 0,
) -> Splits:
    """Deterministic random data: labels (or targets) from a fixed random linear teacher."""
    if task not in ("classification", "regression"):
        raise UserError(f"data.task: '{task}' is not one of: classification, regression")
    if num_samples < 1 or val_samples < 0 or num_classes < 1:
        raise UserError("data: num_samples and num_classes must be >= 1, val_samples >= 0")
    g = torch.Generator().manual_seed(seed)
    dim = 1
    for s in shape:
        dim *= int(s)
    teacher = torch.randn(dim, num_classes, generator=g) / dim**0.5
    bias = torch.randn(num_classes, generator=g)

    def make(n: int) -> TensorDataset:
        x = torch.randn(n, *shape, generator=g)
        out = x.reshape(n, dim) @ teacher + bias
        if task == "classification":
            return TensorDataset(x, out.argmax(1))
        return TensorDataset(x, out + noise * torch.randn(n, num_classes, generator=g))

    train, val = make(num_samples), make(val_samples) if val_samples else None
    return Splits(train, val, DataInfo(tuple(int(s) for s in shape), num_classes))


# ---------------------------------------------------------------------------------------------
# per-rank iteration
# ---------------------------------------------------------------------------------------------


class _Order(Sampler[int]):
    """The indices of the current epoch; one DataLoader (and its persistent workers) reads it."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


AUGMENTS = ("none", "flip", "crop_flip")


def augment(x: torch.Tensor, kind: str, pad: int = 2) -> torch.Tensor:
    """Random horizontal flips (and crops of a `pad`-padded copy), per sample, on x's device."""
    if kind == "none" or x.dim() != 4:
        return x
    n, c, h, w = x.shape
    flip = torch.rand(n, device=x.device) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    if kind == "crop_flip":
        xp = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
        dx = torch.randint(0, 2 * pad + 1, (n,), device=x.device)
        rows = (torch.arange(h, device=x.device)[None, :] + dy[:, None])[:, None, :, None]
        cols = (torch.arange(w, device=x.device)[None, :] + dx[:, None])[:, None, None, :]
        x = xp.gather(2, rows.expand(n, c, h, w + 2 * pad)).gather(3, cols.expand(n, c, h, w))
    return x


class TrainBatches:
    """Per-rank training batches for one epoch, resumable at a batch index.

    Order comes from DistributedSampler (seed + epoch), so it depends only on the seed, the epoch
    and the world size: a resumed run sees exactly the batches the interrupted one would have.
    In-memory datasets are batched by indexing whole tensors (resident on the GPU when asked);
    others go through one DataLoader whose workers persist across epochs.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        device: torch.device,
        num_workers: int = 0,
        resident: bool = False,
        augment: str = "none",
    ) -> None:
        self.dataset, self.batch_size, self.device, self.augment = (
            dataset,
            batch_size,
            device,
            augment,
        )
        n = len(dataset)  # type: ignore[arg-type]
        self.sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.steps_per_epoch = (n // world_size) // batch_size
        if self.steps_per_epoch == 0:
            raise UserError(
                f"data.batch_size={batch_size} x {world_size} worker(s) is larger than the "
                f"{n} training samples: no full batch per epoch",
                f"lower data.batch_size to at most {max(1, n // world_size)}",
            )
        self.tensors: tuple[torch.Tensor, ...] | None = None
        self._order = _Order()
        self._loader: DataLoader[Any] | None = None
        if isinstance(dataset, TensorDataset):
            self.tensors = tuple(t.to(device) if resident else t for t in dataset.tensors)
        else:
            self._loader = DataLoader(
                dataset,
                batch_size=batch_size,
                sampler=self._order,
                num_workers=num_workers,
                pin_memory=device.type == "cuda",
                drop_last=True,
                persistent_workers=num_workers > 0,
            )

    def epoch(self, epoch: int, start: int = 0) -> Iterator[tuple[torch.Tensor, ...]]:
        """Yield this rank's batches of `epoch`, skipping the first `start` (a resumed epoch)."""
        self.sampler.set_epoch(epoch)
        indices = list(iter(self.sampler))[: self.steps_per_epoch * self.batch_size]
        indices = indices[start * self.batch_size :]
        if self.tensors is not None:
            batches = _index_batches(self.tensors, indices, self.batch_size, self.device)
        else:
            assert self._loader is not None
            self._order.indices = indices
            batches = (tuple(t.to(self.device, non_blocking=True) for t in b) for b in self._loader)
        for batch in batches:
            if self.augment != "none":
                batch = (augment(batch[0], self.augment), *batch[1:])
            yield batch


def _index_batches(
    tensors: Sequence[torch.Tensor], indices: list[int], batch_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, ...]]:
    idx = torch.tensor(indices, dtype=torch.long, device=tensors[0].device)
    pin = device.type == "cuda" and tensors[0].device.type == "cpu"
    for start in range(0, len(idx) - batch_size + 1, batch_size):
        sel = idx[start : start + batch_size]
        batch = [t.index_select(0, sel) for t in tensors]
        if pin:
            batch = [b.pin_memory() for b in batch]
        yield tuple(b.to(device, non_blocking=True) for b in batch)


def val_batches(
    dataset: Dataset[Any], batch_size: int, rank: int, world_size: int, device: torch.device
) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's share of the validation set, without padding: every sample counted once."""
    n = len(dataset)  # type: ignore[arg-type]
    indices = list(range(rank, n, world_size))
    if isinstance(dataset, TensorDataset):
        tensors = dataset.tensors
        idx = torch.tensor(indices, dtype=torch.long, device=tensors[0].device)
        for start in range(0, len(idx), batch_size):
            sel = idx[start : start + batch_size]
            yield tuple(t.index_select(0, sel).to(device, non_blocking=True) for t in tensors)
        return
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=indices, pin_memory=device.type == "cuda"
    )
    for batch in loader:
        yield tuple(t.to(device, non_blocking=True) for t in batch)
