"""expctl: config-driven PyTorch DDP experiments.

    import expctl
    result = expctl.run("my.yml", overrides=["optim.lr=0.05"])
    model = expctl.load_model(result.run_dir)
    table = expctl.sweep_results("runs/sweep-...").to_pandas()
    every = expctl.runs("runs").select(sort="-val/acc").to_pandas()   # runs side by side
    scores = expctl.evaluate(result.run_dir, split="test")    # RUN_DIR/eval/NAME.json

Importing expctl imports neither torch nor Hydra; they load when a run starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from expctl import _moved
from expctl.errors import UserError

if TYPE_CHECKING:
    from expctl.api import evaluate, load_model, run
    from expctl.builtin.data import DataInfo, Splits
    from expctl.registry import register
    from expctl.sweep.results import load as sweep_results

__version__ = "0.2.0.dev0"
_moved.install()  # the module paths from before the wings, for one release
__all__ = [
    "run",
    "load_model",
    "evaluate",
    "sweep_results",
    "runs",
    "register",
    "Splits",
    "DataInfo",
    "UserError",
    "__version__",
]


def runs(*roots: Any) -> Any:
    """Every run directory under `roots` (default: runs), sweep trials included: status, the
    config keys that differ, final and best metrics, wall time (see expctl.inspect.compare.load)."""
    from expctl.inspect.compare import load  # noqa: PLC0415 - `import expctl` stays light (~0.3 s)

    return load(roots) if roots else load()  # its default: run.root's


# what `expctl.NAME` is, imported on first use: the functions themselves, not copies of their
# signatures (help(expctl.run) shows api.run's); api.run and the dataset contract need torch
_FORWARDED = {
    "run": ("expctl.api", "run"),
    "load_model": ("expctl.api", "load_model"),
    "evaluate": ("expctl.api", "evaluate"),
    "sweep_results": ("expctl.sweep.results", "load"),  # no torch: reading a sweep trains nothing
    "register": ("expctl.registry", "register"),
    "Splits": ("expctl.builtin.data", "Splits"),
    "DataInfo": ("expctl.builtin.data", "DataInfo"),
}


def __getattr__(name: str) -> Any:
    """The public API's functions and the dataset contract, from the modules that define them."""
    if name in _FORWARDED:
        module, attr = _FORWARDED[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'expctl' has no attribute {name!r}")
