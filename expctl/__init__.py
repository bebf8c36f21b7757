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

from typing import Any

from expctl import _moved
from expctl.errors import UserError

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


def run(config: str | None = None, overrides: Any = (), wait: bool = True) -> Any:
    """Train from a config file (see expctl.api.run)."""
    from expctl.api import run as _run

    return _run(config, overrides, wait)


def load_model(
    run_dir: Any, checkpoint: Any = None, device: str = "cpu", which: str | None = None
) -> Any:
    """Load a run's trained model(s) (see expctl.api.load_model)."""
    from expctl.api import load_model as _load

    return _load(run_dir, checkpoint, device, which)


def evaluate(
    run_dir: Any,
    split: str = "val",
    which: str | None = None,
    overrides: Any = (),
    name: str | None = None,
) -> dict[str, Any]:
    """Score a run's checkpoint on a split or other data (see expctl.api.evaluate)."""
    from expctl.api import evaluate as _evaluate

    return _evaluate(run_dir, split, which, overrides, name)


def sweep_results(sweep_dir: Any) -> Any:
    """Every trial of a sweep: params, metrics, status, run directory (see
    expctl.sweep.results.load)."""
    from expctl.sweep.results import load  # no torch: reading a sweep trains nothing

    return load(sweep_dir)


def runs(*roots: Any) -> Any:
    """Every run directory under `roots` (default: runs), sweep trials included: status, the
    config keys that differ, final and best metrics, wall time (see expctl.inspect.compare.load)."""
    from expctl.inspect.compare import load  # no torch: reading runs trains nothing

    return load(roots) if roots else load()  # its default: run.root's


def register(kind: str, name: str | None = None, **kwargs: Any) -> Any:
    """Register a component factory under `name` (see expctl.registry.register)."""
    from expctl.registry import register as _register

    return _register(kind, name, **kwargs)


def __getattr__(name: str) -> Any:
    """`expctl.Splits` and `expctl.DataInfo`, the dataset contract (see expctl.builtin.data),
    imported on first use (they need torch)."""
    if name in ("Splits", "DataInfo"):
        from expctl.builtin import data

        return getattr(data, name)
    raise AttributeError(f"module 'expctl' has no attribute {name!r}")
