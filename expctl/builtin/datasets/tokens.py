"""``data=tokens``: token ids in flat binary files, nanoGPT's layout: ``ROOT/train.bin`` and
``ROOT/val.bin`` (``ROOT/test.bin`` too, if there), each a plain array of ``uint16`` (or
``uint32``: ``data.dtype``) token ids, memory-mapped, never read whole.

A sample is a window of ``block_size + 1`` tokens: the input is its first ``block_size``, the
target the same shifted by one. Training windows start at random offsets drawn from (train.seed,
epoch, index): the reader seeds each sample's draw so (`expctl.builtin.reader`), so a resumed run
sees exactly the windows the uninterrupted one would have, whatever the number of DataLoader
workers. An epoch is as many windows as tile the file once. Validation and test windows are
fixed: they tile their file from its start.

``DataInfo`` says ``input_shape=(block_size,)`` and ``num_classes=vocab_size``: a model's
``block_size`` and ``vocab_size`` left null are the data's (`model=gpt`). The vocabulary is
``data.vocab_size``, else the largest id in the files + 1 (found once per file, kept in the
cache folder); an id at or beyond ``data.vocab_size`` is refused.

Without ``data.root``: a tiny corpus (byte-level tokens of sentences generated from a seeded
grammar, ~0.4 MB), made in the cache folder on first use: what ``experiment=gpt_tiny`` trains.
"""

from __future__ import annotations

import array
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from expctl.builtin.data import DataInfo, Splits
from expctl.builtin.datasets.files import not_found
from expctl.cache import cache_dir, cache_write, keep, kept_path, read_kept
from expctl.errors import RunError, UserError
from expctl.registry import register

DTYPES = {"uint16": 2, "uint32": 4}
SPLITS = ("train", "val", "test")  # test.bin: optional
CHUNK = 1 << 26  # tokens read at once when looking for the largest id
CORPUS = "tiny-corpus-1"  # the generated corpus's folder in the cache (a new text: a new name)


def _files(root: str | None) -> dict[str, Path]:
    """The token files of each split there is (the generated corpus's without a root)."""
    folder = Path(root).expanduser() if root else _tiny_corpus()
    found = {s: folder / f"{s}.bin" for s in SPLITS if (folder / f"{s}.bin").is_file()}
    missing = [f"{s}.bin" for s in ("train", "val") if s not in found]
    if missing:
        raise not_found("tokens", str(folder.absolute()), " and ".join(missing), download=False)
    return found


def _check(
    root: str | None = None,
    dtype: str = "uint16",
    block_size: int = 1024,
    vocab_size: int | None = None,
    **_: Any,
) -> None:
    """Pre-flight: the values, and the files (but the generated corpus's, made on first use)."""
    if dtype not in DTYPES:
        raise UserError(
            f"data.dtype={dtype!r} is not one of: {', '.join(DTYPES)}",
            "the type the token files were written with (numpy's name)",
        )
    for key, value in (("block_size", block_size), ("vocab_size", vocab_size)):
        if value is not None and value < 1:
            raise UserError(f"data.{key}={value}: must be at least 1", f"set data.{key} >= 1")
    if root is not None:
        _check_files(_files(root), dtype, block_size)


def _check_files(files: dict[str, Path], dtype: str, block_size: int) -> None:
    """Each file is whole tokens of `dtype`, at least one window of them."""
    for path in files.values():
        size, width = path.stat().st_size, DTYPES[dtype]
        if size % width:
            raise UserError(
                f"data=tokens: {path} has {size} bytes, not a whole number of {dtype} tokens "
                f"({width} bytes each)",
                "set data.dtype to the type the file was written with (uint16 or uint32)",
            )
        if dtype == "uint16" and _wider(path):
            raise UserError(
                f"data=tokens: {path} reads as uint32 tokens, not data.dtype=uint16 (every "
                "second uint16 of its first 8,192 is 0: the high halves of 32-bit ids)",
                "set data.dtype=uint32",
            )
        if size // width < block_size + 1:
            raise UserError(
                f"data=tokens: {path} holds {size // width} tokens, fewer than one window of "
                f"data.block_size + 1 = {block_size + 1}",
                "lower data.block_size, or use a larger file",
            )


def _wider(path: Path) -> bool:
    """Whether a file read as uint16 looks written as uint32 (little-endian ids below 65,536:
    each id's upper half is 0); no text tokenises to id 0 at every second place."""
    head = array.array("H")
    with path.open("rb") as f:
        head.frombytes((data := f.read(2 * 8192))[: len(data) // 4 * 4])
    if sys.byteorder != "little":
        head.byteswap()
    return len(head) >= 2 and not any(head[1::2]) and any(head[0::2])


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of `block_size` + 1 tokens of one file as (input, target) int64 tensors: at
    random offsets (`random`: drawn from torch's seed, which the reader sets for each sample
    from (seed, epoch, index)) or tiling the file."""

    def __init__(self, path: Path, dtype: str, block_size: int, random: bool) -> None:
        self.path, self.dtype, self.block_size, self.random = path, dtype, block_size, random
        self.tokens = path.stat().st_size // DTYPES[dtype]
        self._data: np.memmap[Any, Any] | None = None

    def __len__(self) -> int:
        return (self.tokens - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.block_size
        if self.random:  # a generator of its own: the global one (dropout's) is not drawn from
            seed = (torch.initial_seed() * 1_000_003 + index) % 2**63
            g = torch.Generator().manual_seed(seed)
            start = int(torch.randint(self.tokens - self.block_size, (), generator=g))
        if self._data is None:  # opened in the process that reads: a worker maps it itself
            self._data = np.memmap(self.path, dtype=self.dtype, mode="r")
        window = torch.from_numpy(self._data[start : start + self.block_size + 1].astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_data": None}

    def describe(self) -> str:
        """For the run's first log line."""
        return (
            f"windows of {self.block_size} + 1 tokens at random offsets in {self.tokens:,} "
            f"{self.dtype} tokens of {self.path}"
        )


def largest(path: Path, dtype: str) -> int:
    """The largest token id in `path`: read once, then kept in the cache folder (by the file's
    size, times and inode)."""
    where = kept_path("tokens", path, [path])
    kept = read_kept(where)
    if isinstance(kept, dict) and kept.get("dtype") == dtype and isinstance(kept.get("max"), int):
        return int(kept["max"])
    data = np.memmap(path, dtype=dtype, mode="r")
    top = max(int(data[i : i + CHUNK].max()) for i in range(0, len(data), CHUNK))
    keep(where, {"dtype": dtype, "max": top})
    return top


@register("datasets", check=_check)
def tokens(
    root: str | None = None,
    dtype: str = "uint16",
    block_size: int = 1024,
    vocab_size: int | None = None,
) -> Splits:
    """Token ids in flat .bin files (nanoGPT's train.bin/val.bin); null root: a tiny corpus."""
    _check(None, dtype, block_size, vocab_size)
    files = _files(root)
    _check_files(files, dtype, block_size)
    top = max(largest(path, dtype) for path in files.values())
    if vocab_size is not None and top >= vocab_size:
        worst = next(p for p in files.values() if largest(p, dtype) == top)
        raise UserError(
            f"data=tokens: {worst} holds token id {top}, beyond data.vocab_size={vocab_size} "
            f"(ids are 0..{vocab_size - 1})",
            f"set data.vocab_size to at least {top + 1} (the tokenizer's vocabulary), or check "
            "data.dtype",
        )
    made = {s: TokenWindows(p, dtype, block_size, random=s == "train") for s, p in files.items()}
    info = DataInfo((block_size,), vocab_size or top + 1)
    return Splits(made["train"], made["val"], info, test=made.get("test"))


# ---------------------------------------------------------------------------------------------
# the generated corpus of experiment=gpt_tiny
# ---------------------------------------------------------------------------------------------

_WORDS = {
    "who": ["the cat", "a dog", "the old man", "my sister", "the bird", "a child", "the farmer",
            "our teacher", "the king", "a small fox"],
    "does": ["sees", "likes", "follows", "finds", "helps", "watches", "calls", "meets",
             "paints", "remembers"],
    "what": ["the red ball", "a green apple", "the river", "a quiet song", "the tall tree",
             "an open door", "the blue boat", "a warm bread", "the stars", "a wooden chair"],
    "where": ["in the garden", "near the river", "at the market", "under the bridge",
              "on the hill", "by the sea", "in the morning", "after the rain"],
}  # fmt: skip


def tiny_text(sentences: int, seed: int) -> str:
    """Sentences of a small grammar, drawn from `seed` (the same text on every Python)."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        who, does, what, where = (w[rng.randrange(len(w))] for w in _WORDS.values())
        out.append(f"{who} {does} {what} {where}.".capitalize())
    return "\n".join(out) + "\n"


def _tiny_corpus() -> Path:
    """The generated corpus's folder in the cache, made on first use (each file atomically:
    ranks that make it at once write the same bytes)."""
    folder = cache_dir() / "data" / CORPUS
    for split, (sentences, seed) in {"train": (8000, 0), "val": (800, 1)}.items():
        path = folder / f"{split}.bin"
        if not path.is_file():
            ids = np.frombuffer(tiny_text(sentences, seed).encode("ascii"), dtype=np.uint8)
            cache_write(path, [ids.astype(np.uint16).tobytes()])
        if not path.is_file():
            raise RunError(
                f"data=tokens: cannot write the generated corpus into {folder} (set "
                "EXPCTL_CACHE_DIR to a writable folder, or data.root to your token files)"
            )
    return folder
