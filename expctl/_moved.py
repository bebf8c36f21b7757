"""The module paths from before the wings (issue 26), importable for one release: `import
expctl.loggers` gives `expctl.builtin.loggers` itself (the same module object, so isinstance
and monkeypatching hold) with a DeprecationWarning at the importing line.

A finder rather than a stub file at each old path: `expctl.datasets.images` and the rest of a
moved package resolve too, without loading a second copy that would register every dataset
again, and the old files stay moved (git follows a concurrent edit of them to the new path).
expctl never imports an old path itself, so neither `import expctl` nor `expctl --help` warns.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

# old module (under expctl.) -> where it lives now; a package's submodules follow it. config,
# rank and sweep are the names of wings now, so their old modules cannot be kept this way.
MOVED = {
    "compose": "config.compose",
    "confstore": "config.confstore",
    "explain": "config.explain",
    "yamlfile": "config.yamlfile",
    "models": "builtin.models",
    "tvmodels": "builtin.tvmodels",
    "optim": "builtin.optim",
    "steps": "builtin.steps",
    "loggers": "builtin.loggers",
    "checks": "builtin.checks",
    "catalogue": "builtin.catalogue",
    "data": "builtin.data",
    "reader": "builtin.reader",
    "datasets": "builtin.datasets",
    "train": "rank.train",
    "build": "rank.build",
    "metrics": "rank.metrics",
    "checkpoint": "rank.checkpoint",
    "control": "rank.control",
    "report": "rank.report",
    "hooks": "rank.hooks",
    "rundir": "rank.rundir",
    "runlock": "rank.runlock",
    "provenance": "rank.provenance",
    "launch": "jobs.launch",
    "slurm": "jobs.slurm",
    "slurmstate": "jobs.slurmstate",
    "snapshot": "jobs.snapshot",
    "study": "jobs.study",
    "exploit": "jobs.exploit",
    "pbt": "jobs.pbt",
    "space": "sweep.space",
    "ledger": "sweep.ledger",
    "results": "sweep.results",
    "plots": "sweep.plots",
    "trials": "sweep.trials",
    "pool": "sweep.pool",
    "resources": "sweep.resources",
    "status": "inspect.status",
    "compare": "inspect.compare",
}


def new_name(name: str) -> str | None:
    """Where the module `name` lives now, or None if it did not move."""
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "expctl" or parts[1] not in MOVED:
        return None
    return ".".join(["expctl", MOVED[parts[1]], *parts[2:]])


class _Finder:
    """Resolves an old path to the module at its new one (a meta path finder and its loader;
    not importlib.abc's classes, which would add their imports to `import expctl`)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_name(spec.name)
        assert new is not None
        warnings.warn(  # stacklevel 2: the import machinery's frames are skipped
            f"{spec.name} is {new} now; import it from there ({spec.name} goes in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system gave the module the old path's spec; it keeps its own
        module.__spec__ = self._specs.pop(module.__spec__.name)  # type: ignore[union-attr]


def install() -> None:
    """Put the finder first, ahead of the one that would find a moved package's files again."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
