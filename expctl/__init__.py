"""expctl: config-driven PyTorch DDP experiments.

    import expctl
    result = expctl.run("my.yml", overrides=["optim.lr=0.05"])
    model = expctl.load_model(result.run_dir)                  # which="best" | "last" | PATH
    scores = expctl.evaluate(result.run_dir, split="test")    # RUN_DIR/eval/NAME.json

Importing expctl imports neither torch nor Hydra; they load when a run starts.
"""

from __future__ import annotations

from typing import Any

from expctl.errors import UserError

__version__ = "0.2.0.dev0"
__all__ = ["run", "load_model", "evaluate", "register", "UserError", "__version__"]


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


def register(kind: str, name: str | None = None, **kwargs: Any) -> Any:
    """Register a component factory under `name` (see expctl.registry.register)."""
    from expctl.registry import register as _register

    return _register(kind, name, **kwargs)
