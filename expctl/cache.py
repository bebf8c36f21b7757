"""The user's cache folder (`cache_dir`: EXPCTL_CACHE_DIR, else ~/.cache/expctl): what can be
made again and is kept to be fast (the components' catalogue, torchvision's signatures, decoded
.gz datasets, values kept per source file: `kept_path`). Written by the atomic writer, not
flushed to disk; a cache that cannot be written or read is made again, never an error.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from expctl.atomic import atomic_file, is_temporary

CACHE_ENV = "EXPCTL_CACHE_DIR"  # the user's cache folder: `expctl list`, decoded .gz datasets


def cache_dir() -> Path:
    """EXPCTL_CACHE_DIR, else $XDG_CACHE_HOME/expctl, else ~/.cache/expctl."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "expctl"


def cache_key(versions: Iterable[str], files: Iterable[Path]) -> str:
    """A cache's key: what it was made from (package versions, and the path, size and mtime of
    each source file it depends on)."""
    stats = [(str(f), st.st_size, st.st_mtime_ns) for f in files for st in (f.stat(),)]
    return hashlib.sha256(json.dumps([list(versions), stats]).encode()).hexdigest()[:24]


def cache_write(path: Path, chunks: Iterable[bytes], stale: Iterable[Path] = ()) -> None:
    """Write a cache file atomically (`atomic_file`, not flushed to disk: a lost cache is made
    again) and remove `stale` older versions of it. A cache that cannot be written is no error:
    the temporary file is removed whatever fails (a full disk, a signal's exception), and the
    caller makes the content again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, durable=False) as f:
            for chunk in chunks:
                f.write(chunk)
        for old in stale:
            if old != path and not is_temporary(old):
                old.unlink(missing_ok=True)
    except OSError:
        pass


def kept_path(folder: str, source: Path, files: Iterable[Path]) -> Path | None:
    """Where a value made from `files` is kept in the cache folder (`folder` in it): named by
    `source` (one kept value per source) and stamped with each file's size, mtime, inode and
    ctime (which nothing can set back); a file that is absent counts too. None: one cannot be
    read."""
    stamps = [(f, file_stamp(f)) for f in files]
    if any(stamp == "?" for _, stamp in stamps):
        return None
    name = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    stamp = hashlib.sha256("|".join(f"{f}:{st}" for f, st in stamps).encode()).hexdigest()[:8]
    return cache_dir() / folder / f"{name}-{stamp}"


def file_stamp(f: Path) -> str:
    """What changes whenever `f` does: its size, mtime, inode and ctime (which nothing can set
    back); "-" when it is absent, "?" when it cannot be read."""
    try:
        st = f.stat()
    except FileNotFoundError:
        return "-"
    except OSError:
        return "?"
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}"


def read_kept(path: Path | None) -> Any:
    """The value kept at `path` (`kept_path`), None when there is none."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def keep(path: Path | None, value: Any) -> None:
    """Keep `value` at `path`, replacing what was kept for the same source, if JSON holds it as it
    is (no tuples, no int keys)."""
    if path is None:
        return
    text = json.dumps(value)
    if json.loads(text) == value:
        name = path.name.rsplit("-", 1)[0]
        stale = list(path.parent.glob(f"{name}-*")) if path.parent.is_dir() else []
        cache_write(path, [text.encode()], stale)
