"""Where the modules a config lists under ``imports:`` are searched: after the standard library
and site-packages (a torchvision.py beside the user's files never shadows torchvision), in the
current directory, the -C file's folder (EXPCTL_IMPORT_PATH, for the processes a launch starts),
a Slurm job's code snapshot and the folders a run recorded for them (`origins`). The module
search path only: `registry.import_user_modules` imports them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

IMPORT_PATH = "EXPCTL_IMPORT_PATH"  # folders of -C files, for the processes a launch starts


def add_import_path(folder: Path) -> str:
    """The value of EXPCTL_IMPORT_PATH with `folder` (the -C file's) added: where
    `import_user_modules` looks for ``imports:`` modules, in this process and the workers it
    starts, after the standard library and site-packages. Not PYTHONPATH: its entries come
    before site-packages, where a torchvision.py beside the file would win."""
    path = str(folder)
    parts = [p for p in os.environ.get(IMPORT_PATH, "").split(os.pathsep) if p]
    return os.pathsep.join(parts if path in parts else [*parts, path])


def search_working_dir_last() -> None:
    """Move the current directory, which ``python -m`` (expctl's workers, torchrun, a submitit
    job) puts first on the module search path, behind the standard library and site-packages:
    a torchvision.py there never shadows torchvision. ``imports:`` modules there are still found."""
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path.append(sys.path.pop(0))


def search_first(folders: Iterable[str]) -> None:
    """Search `folders` (a Slurm job's code snapshot) for ``imports:`` modules before the current
    directory and the -C file's folder, still after the standard library and site-packages.
    A current directory first on the path stays there: the caller's (a script, `load_model`
    in a notebook) is not ours to move."""
    here = [i for i, p in enumerate(sys.path) if i > 0 and p in ("", os.getcwd())]
    at = here[0] if here else len(sys.path)
    for folder in reversed(list(folders)):
        if folder not in sys.path:
            sys.path.insert(at, folder)


@contextlib.contextmanager
def searching(recorded: Iterable[Mapping[str, str]]) -> Iterator[None]:
    """The module search path while ``imports:`` modules import, after the standard library and
    site-packages: first the folders a run recorded for them (`recorded`, from its imports.json:
    see `origins`) while the recorded file is still there, so that a same-named module
    elsewhere never stands in for it; then the current directory and the -C file's folder
    (EXPCTL_IMPORT_PATH)."""
    # A caller's working directory first on the path (`python -c`, a notebook calling
    # load_model) is searched after the recorded folders while they import, then put back.
    first = sys.path.pop(0) if sys.path[:1] and sys.path[0] in ("", os.getcwd()) else None
    if first is not None:
        sys.path.append(first)
    try:
        recorded = list(recorded)
        search_first(w["path"] for w in recorded if Path(w.get("file") or w["path"]).exists())
        extra = [str(Path.cwd()), *os.environ.get(IMPORT_PATH, "").split(os.pathsep)]
        extra += [w["path"] for w in recorded]
        for folder in extra:
            if folder and folder not in sys.path:
                sys.path.append(folder)
        yield
    finally:
        if first is not None and first in sys.path:
            del sys.path[len(sys.path) - 1 - sys.path[::-1].index(first)]
            sys.path.insert(0, first)


def origins(modules: Iterable[str]) -> dict[str, dict[str, str]]:
    """Where each imported module of `modules` was found: its ``file`` and the ``path`` folder
    that holds it (what goes on the module search path to import it by name again)."""
    out = {}
    for mod in modules:
        file = getattr(sys.modules.get(mod), "__file__", None)
        if not file:
            continue  # not imported here, or a namespace package
        where = Path(file).absolute()
        root = where.parent
        for _ in range(mod.count(".") + (where.name == "__init__.py")):
            root = root.parent
        out[mod] = {"file": str(where), "path": str(root)}
    return out
