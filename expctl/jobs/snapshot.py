"""The code a Slurm job imports: a copy of the user's code made when the job is submitted, so a
job that waits in the queue runs what was submitted, not what is on disk when it starts.

`launcher.snapshot` picks what is copied:

- ``git``: the files git tracks in the user's repository (the -C file's, else the working
  directory's), as they are in the working tree (uncommitted edits included; untracked files,
  ``.git``, the run directories and anything git ignores left out);
- ``imports``: the package (or single file) of each ``imports:`` module;
- ``auto`` (the default): ``git`` when that repository holds every ``imports:`` module, else
  ``imports``; nothing without ``imports:`` modules;
- ``none``: no copy; the job imports the files on disk when it starts.

The copy goes to RUN_DIR/code/ID (a sweep's: SWEEP_DIR/code/ID), one per submission, and is
refused beyond ``launcher.snapshot_max_mb``. The job searches it for ``imports:`` modules before
the working directory and the -C file's folder (`importpath.search_first`); installed packages,
and modules reached through PYTHONPATH (searched first by Python), come from there as always.

submitit's own ``helpers.RsyncSnapshot`` does not fit: it clones ``.git`` into the snapshot,
needs rsync, has no size bound, and moves the job's working directory into the copy (relative
data paths in the config would then point into it).
"""

from __future__ import annotations

import contextlib
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl import importpath, registry
from expctl.config.schema import Config
from expctl.errors import UserError
from expctl.rank.provenance import Launch, git_output, repo_root

_NEVER = {".git", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache"}
_HINT = (
    "launcher.snapshot=imports copies only the imports: modules' packages; "
    "launcher.snapshot=none copies nothing (the job imports the files on disk when it starts)"
)


@dataclass(frozen=True)
class Plan:
    """What to copy: (source file, path in the snapshot) pairs, and the folders of the snapshot
    to search for ``imports:`` modules."""

    mode: str
    files: tuple[tuple[Path, str], ...]
    paths: tuple[str, ...]
    size: int


def plan(cfg: Config, launch: Launch) -> Plan | None:
    """What `cfg`'s job should import from a copy (None: nothing), checked before anything is
    written or submitted.

    Raises:
        UserError: launcher.snapshot=git outside a repository, or a copy over the size bound.
    """
    mode = cfg.launcher.snapshot
    if mode == "none":
        return None
    registry.import_user_modules(cfg.imports)  # imported already when the config was composed
    found = {m: f for m, f in importpath.origins(cfg.imports).items() if not _installed(f["file"])}
    root = repo_root(launch.folder())
    if mode == "auto":
        if not found:
            return None
        inside = root is not None and all(_within(Path(f["file"]), root) for f in found.values())
        mode = "git" if inside else "imports"
    if mode == "git":
        if root is None:
            raise UserError(
                f"launcher.snapshot=git: {launch.folder()} is in no git repository", _HINT
            )
        out = _git_plan(root, found, Path(cfg.run.root).expanduser().absolute())
    else:
        out = _imports_plan(found)
    _check_size(out, cfg.launcher.snapshot_max_mb)
    return out


def _installed(file: str) -> bool:
    """Whether `file` belongs to the standard library or site-packages (never copied)."""
    paths = sysconfig.get_paths()
    return any(_within(Path(file), Path(paths[k])) for k in ("stdlib", "purelib", "platlib"))


def _within(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _git_plan(root: Path, found: Mapping[str, Mapping[str, str]], runs: Path) -> Plan:
    listing = git_output(root, "ls-files", "-z", limit=1 << 30)
    names = [n for n in (listing[0] if listing else "").split("\0") if n]
    files = []
    for name in names:
        src = root / name
        if _NEVER & set(Path(name).parts) or _within(src, runs) or not src.is_file():
            continue  # excluded, a run's file, deleted in the working tree, or a submodule
        files.append((src, name))
    folders = {  # an imports: module outside the repository is imported from where it is
        str(Path(f["path"]).resolve().relative_to(root.resolve()))
        for f in found.values()
        if _within(Path(f["path"]), root)
    }
    return Plan("git", tuple(files), tuple(sorted(folders)) or (".",), _size(files))


def _imports_plan(found: Mapping[str, Mapping[str, str]]) -> Plan:
    files: dict[str, Path] = {}
    for module, where in found.items():
        top, base = module.split(".")[0], Path(where["path"])
        if (base / top).is_dir():
            for src in sorted((base / top).rglob("*")):
                if src.is_file() and not _NEVER & set(src.relative_to(base).parts):
                    files[str(src.relative_to(base))] = src
        else:
            files[Path(where["file"]).name] = Path(where["file"])
    pairs = [(src, rel) for rel, src in sorted(files.items())]
    return Plan("imports", tuple(pairs), (".",), _size(pairs))


def _size(files: list[tuple[Path, str]]) -> int:
    return sum(src.lstat().st_size for src, _ in files)


def _check_size(p: Plan, max_mb: float) -> None:
    if p.size <= max_mb * 1e6:
        return
    big = max(p.files, key=lambda f: f[0].lstat().st_size)
    raise UserError(
        f"launcher.snapshot={p.mode}: the code to copy for the job is {p.size / 1e6:.1f} MB in "
        f"{len(p.files)} file(s) (largest: {big[1]}, {big[0].lstat().st_size / 1e6:.1f} MB), "
        f"over launcher.snapshot_max_mb={max_mb:g}",
        "keep data and large files out of git (or out of the imports: packages), raise "
        "launcher.snapshot_max_mb, or: " + _HINT,
    )


def copy(p: Plan, parent: Path) -> dict[str, Any]:
    """Copy the planned files into a new folder under `parent`; returns the launch's record of
    it: mode, folder, the folders the job searches, file count and bytes.

    Raises:
        UserError: the copy could not be written (nothing is left of it).
    """
    dest: Path | None = None
    try:
        parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        dest = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=parent))
        dest.chmod(0o750)
        for src, rel in p.files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    except OSError as e:
        if dest is not None:
            shutil.rmtree(dest, ignore_errors=True)
        raise UserError(
            f"cannot write the code snapshot under {parent}: {e.strerror or e}",
            "free space there, or launcher.snapshot=none",
        ) from None
    return {
        "mode": p.mode,
        "dir": str(dest),
        "paths": [str((dest / rel).resolve()) for rel in p.paths],
        "files": len(p.files),
        "bytes": p.size,
    }


def discard(record: Mapping[str, Any] | None) -> None:
    """Remove the copy `copy` made (its job was not submitted)."""
    if record is not None:
        shutil.rmtree(record["dir"], ignore_errors=True)
        with contextlib.suppress(OSError):
            Path(record["dir"]).parent.rmdir()  # code/, when this copy was its only one
