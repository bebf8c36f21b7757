"""The one way expctl replaces a file: whole or not at all (`atomic_file`, `write_atomically`),
a folder too (`temporary_folder`, `replace_folder`; `remove` deletes one so), and the unfinished
files a process killed mid-write leaves (`temporaries`); `deferred_interrupt` holds a Ctrl-C
until a write that must not be cut (a checkpoint) is done. `layout.py` names
the files of a run and a sweep directory; every one that is replaced whole is written here.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _temporary(path: Path) -> Path:
    """Where `atomic_file` writes `path` before it is whole: hidden beside it, this process's."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(3).hex()}")


def is_temporary(path: Path) -> bool:
    """Whether `path` is a file `atomic_file` has not finished."""
    return path.name.startswith(".") and ".tmp-" in path.name


def temporaries(folder: Path, name: str = "*") -> list[Path]:
    """The unfinished files of `folder` whose final names match `name` (a glob): what a process
    killed mid-write left."""
    return sorted(folder.glob(f".{name}.tmp-*"))


@contextmanager
def atomic_file(path: Path, mode: int = 0o666, durable: bool = True) -> Iterator[BinaryIO]:
    """A file written to whole or not at all, the one way expctl replaces a file: the block
    writes a temporary file in the same folder, which then is flushed to disk (unless not
    `durable`) and renamed over `path`. A reader (or a crash, or a full disk) never finds a
    half-written or empty file under the name; the temporary file is removed whatever fails,
    and `path` stays as it was when the block raises.

    Args:
        mode: the new file's permissions, less the umask.
        durable: fsync before the rename (a cache that can be made again need not).

    Raises:
        OSError: the write failed (`path` is as it was).
    """
    tmp = _temporary(path)
    try:
        with open(tmp, "xb", opener=lambda p, flags: os.open(p, flags, mode)) as f:
            yield f  # f.name: the temporary file's path
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomically(path: Path, data: str | bytes, mode: int = 0o666) -> None:
    """Write `path` whole or not at all (`atomic_file`).

    Args:
        mode: the new file's permissions, less the umask.

    Raises:
        OSError: the write failed (`path` is as it was).
    """
    with atomic_file(path, mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


def temporary_folder(path: Path) -> Path:
    """A new hidden folder beside `path`, to fill before `replace_folder` names it `path` (what
    a process killed meanwhile leaves is one of `temporaries`)."""
    tmp = _temporary(path)
    tmp.mkdir(mode=0o750)
    return tmp


def replace_folder(tmp: Path, path: Path, ready: Callable[[], None]) -> None:
    """Name the filled folder `tmp` (`temporary_folder`) `path`, whole or not at all: its files
    (each synced by its writer) and the folder synced first. A folder `path` already there is
    renamed out of the way first and removed last; `ready()` runs in between, while nothing has
    the name (a checksum of the new folder written there never describes the old one).

    Raises:
        OSError: a rename failed (`path` is the old folder, or absent).
    """
    fsync_dir(tmp)
    old = None
    if path.exists():
        old = _temporary(path)
        path.rename(old)
    ready()
    os.replace(tmp, path)
    fsync_dir(path.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove(path: Path) -> None:
    """Delete a file, or a folder: renamed to a temporary name first, so that a folder half
    deleted is never found under its name."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
        return
    if not is_temporary(path):
        gone = _temporary(path)
        path.rename(gone)
        path = gone
    shutil.rmtree(path)


def fsync_dir(folder: Path) -> None:
    """Put a folder's entries (names made, renamed, removed) on disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def deferred_interrupt() -> Iterator[None]:
    """A SIGINT inside is held, and sent again on leaving, to the handler it was meant for
    (Python's raises KeyboardInterrupt). Only the main thread can: elsewhere, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        if got:
            signal.raise_signal(signal.SIGINT)
