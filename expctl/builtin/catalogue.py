"""expctl's own components, described without importing them: what `expctl list`, `run --help`,
completion and `expctl show` read.

The built-in component modules import torch, torchvision and torch._dynamo (seconds). What those
commands need of them (names, descriptions, signatures, settings) depends only on the versions
of Python, torch, torchvision and expctl's own source files, so it is kept as a snapshot (each
entry as `description.py` encodes it) in the user's cache folder (`cache.cache_dir`), made once
per set of versions by a background process (`make`): the first command that finds none starts
it, and `.ci/setup` makes it at install. The
registry then serves described entries (`registry.describe_builtins`); calling a factory or a
pre-flight check imports the module behind it. Plugins and ``--import`` / ``imports:`` modules
are imported as before and register on top.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expctl import registry, signatures
from expctl.builtin.description import decode, encode
from expctl.cache import cache_dir, cache_key, cache_write

_PREFIX = "registry-"
_KEEP = 8  # snapshots kept in a shared cache folder: one per environment using it
_STARTING_S = 15.0  # a lock without its pid yet: how long it may stay so (a loaded machine)
_WAIT_S = 600.0  # the longest wait for a builder that holds its lock


def key() -> str:
    """What the snapshot is made of: Python, torch, torchvision, expctl's source files (its
    version among them: __init__.py)."""
    versions = [sys.version]
    for dist in ("torch", "torchvision"):
        try:
            versions.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            versions.append("")
    return cache_key(versions, sorted(Path(__file__).resolve().parents[1].rglob("*.py")))


def snapshot_file() -> Path:
    return cache_dir() / f"{_PREFIX}{key()}.json"


def describe(wait: bool = True) -> bool:
    """Serve the built-in components from the snapshot (True): this environment's, else the
    one shipped with expctl when it describes this environment, else one a background process
    makes. `wait`: wait for that process (a note on a terminal); False when it fails, then the
    caller imports the components itself (`registry.get`)."""
    if registry.builtins_known():
        return True
    path = snapshot_file()
    described = _read(path)
    shipped = _shipped() if described is None else None
    if shipped is not None:
        write(path, shipped)  # this environment's from now on
        described = [decode(d) for d in shipped]
    if described is None:
        if not start(path) or not wait or not _wait(path):
            return False
        described = _read(path)
        if described is None:
            return False
    registry.describe_builtins(described)
    return True


# The snapshot shipped in the package, made for the versions CI pins (.ci/constraints.txt):
# after `pip install`, the first command that reads the components does not wait for torch's
# import. It holds what it was made from; a test checks that it is this source tree's.
SHIPPED = Path(__file__).with_name("catalogue.json")


def shipped_key() -> dict[str, str]:
    """What the shipped snapshot must have been made from to describe this environment: the
    Python minor version, torch's and torchvision's versions, and the contents of the modules
    that register the built-in components (and of those that describe them)."""
    out = {"python": "{}.{}".format(*sys.version_info[:2])}
    for dist in ("torch", "torchvision"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = ""
    digest = hashlib.sha256()
    describing = (
        "expctl.builtin.catalogue",
        "expctl.builtin.description",
        "expctl.registry",
        "expctl.builtin.checks",
        "expctl.builtin.datasets.tensors",
        "expctl.builtin.datasets.files",  # in_memory_args: ten datasets' signatures
        "expctl.builtin.datasets.preflight",  # the datasets' light checks
    )
    for module in (*registry.BUILTIN_MODULES, *describing):
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            return {}
        digest.update(module.encode() + b"\0" + Path(spec.origin).read_bytes())
    out["sources"] = digest.hexdigest()
    return out


def _shipped() -> list[dict[str, Any]] | None:
    """The shipped snapshot's entries, when it describes this environment."""
    try:
        shipped = json.loads(SHIPPED.read_text())
        if shipped["made_from"] and shipped["made_from"] == shipped_key():
            return list(shipped["entries"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return None


def write_shipped() -> None:
    """Describe this environment's components into the package (`python -m expctl.builtin.catalogue`),
    for the versions CI pins."""
    entries = [encode(*described) for described in registry.builtin_entries()]
    lines = ",\n".join(json.dumps(e) for e in entries)  # an entry a line: diffs show what changed
    made_from = json.dumps(shipped_key())
    SHIPPED.write_text(f'{{"made_from": {made_from},\n"entries": [\n{lines}\n]}}\n')


def listing(kinds: Sequence[str]) -> str:
    """What `expctl list` prints for `kinds` (canonical kind names)."""
    return "".join(render(kind) for kind in kinds)


def render(kind: str) -> str:
    """One kind's section: each name with its description, then its settable arguments."""
    lines = [f"{kind}:"]
    for name in registry.names(kind):
        entry = registry.get(kind, name)
        lines.append(f"  {name:<28} {entry.description}")
        sig = signatures.describe(entry)
        if sig:
            lines.append(f"  {'':<28}   ({sig})")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# making the snapshot (in its own process) and waiting for it
# ---------------------------------------------------------------------------------------------

# the builder: the working directory last on the module search path (a torch.py there never
# shadows torch), niced (it runs while the user works)
_BUILDER = (
    "import os, sys; sys.path.append(sys.path.pop(0)); os.nice(10)\n"
    "from expctl.builtin import catalogue; catalogue.make(locked=True)"
)


_child: subprocess.Popen[bytes] | None = None  # the builder this process started


def start(path: Path) -> bool:
    """Start the background process that makes the snapshot at `path`, unless one runs;
    False when none can run (no cache folder). The lock file, taken here, names its pid."""
    global _child
    fd = _lock(path)
    if fd is None:
        return _builder_alive(path)
    try:
        _child = proc = subprocess.Popen(
            [sys.executable, "-c", _BUILDER],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not killed with the terminal's process group (Ctrl-C)
        )
        os.write(fd, str(proc.pid).encode())
        return True
    except OSError:
        path.with_suffix(".lock").unlink(missing_ok=True)
        return False  # no process: the caller imports the components itself
    finally:
        os.close(fd)


def make(locked: bool = False) -> None:
    """Make the snapshot of this environment, unless another process makes it (`locked`: the
    process that started this one took the lock for it)."""
    path = snapshot_file()
    if not locked:
        fd = _lock(path)
        if fd is None:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
    try:
        if _read(path) is None:
            write(path, [encode(*described) for described in registry.builtin_entries()])
    finally:
        path.with_suffix(".lock").unlink(missing_ok=True)


def _lock(path: Path) -> int | None:
    """The lock file of `path`, created (a stale one replaced); None when a live builder holds
    it or no cache folder can be made."""
    lock = path.with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # EXPCTL_CACHE_DIR names a file, or cannot be made
        return None
    for _ in range(2):
        try:
            return os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _builder_alive(path):
                return None
            lock.unlink(missing_ok=True)  # its builder died: take over
        except OSError:
            return None
    return None


def write(path: Path, entries: list[dict[str, Any]]) -> None:
    others = list(path.parent.glob(f"{_PREFIX}*.json")) if path.parent.is_dir() else []
    stale = sorted(others, key=_mtime, reverse=True)[_KEEP - 1 :]
    stored = {"entries": entries, "sha256": _digest(entries)}
    cache_write(path, [json.dumps(stored).encode()], stale)


def _builder_alive(path: Path) -> bool:
    """Whether a builder holds the lock of `path` and still runs."""
    lock = path.with_suffix(".lock")
    try:
        pid = int(lock.read_text() or 0)
    except (OSError, ValueError):
        return False
    if not pid:  # created, its pid not written yet
        return time.time() - _mtime(lock) < _STARTING_S
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # someone else's process: alive
    return True


def _wait(path: Path) -> bool:
    """Wait for the snapshot at `path`; False when its builder ended without one."""
    if sys.stderr.isatty():
        print(
            "expctl: describing the built-in components once for this installation "
            "(torch loads; a few seconds) ...",
            file=sys.stderr,
        )
    began = time.monotonic()
    while not path.is_file():
        ended = _child.poll() is not None if _child is not None else not _builder_alive(path)
        if ended or time.monotonic() - began > _WAIT_S:
            return path.is_file()
        time.sleep(0.05)
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another process
        return 0.0


def _read(path: Path) -> list[tuple[str, registry.Entry, str]] | None:
    """The described entries, or None when absent, unreadable or not as written (a checksum
    guards against a truncated or edited file: then it is made again)."""
    try:
        stored = json.loads(path.read_text())
        entries, digest = stored["entries"], stored["sha256"]
        if digest != _digest(entries):
            return None
        return [decode(d) for d in entries]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _digest(entries: object) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    write_shipped()
