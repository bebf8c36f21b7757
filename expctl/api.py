"""The Python API: train from a config inside a larger program, and load what a run trained."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expctl import compose, launch, registry
from expctl import config as config_mod
from expctl.errors import UserError
from expctl.launch import Result


def run(config: str | None = None, overrides: Sequence[str] = (), wait: bool = True) -> Result:
    """Compose `config` (a .yml/.yaml path, or None for the built-in default) with Hydra-style
    `overrides`, validate it, train with its launcher and return the result (launcher=slurm:
    once submitted, unless `wait`).

    Raises:
        UserError: a bad config, name, value or environment.
    """
    import sys

    notes: list[str] = []
    cfg = compose.compose(config, overrides, notes=notes)
    for note in notes:
        print(f"expctl: note: {note}", file=sys.stderr, flush=True)
    return launch.launch(cfg, wait=wait)


def load_model(
    run_dir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu"
) -> Any:
    """The trained model of a run (a dict of models for multi-model runs), in eval mode.

    Args:
        run_dir: the run directory printed at the start of the run.
        checkpoint: a specific checkpoint file; default the newest valid one.
        device: where to put the weights.

    Raises:
        UserError: no run directory or no loadable checkpoint.
    """
    from expctl import checkpoint as ckpt  # lazy: torch loads only when a model does

    run_dir = Path(run_dir)
    cfg = config_mod.load(run_dir)
    registry.import_user_modules(cfg.imports)
    if checkpoint is not None:
        path, payload = Path(checkpoint), ckpt.load(Path(checkpoint), device)
    else:
        found = ckpt.newest_valid(run_dir, device)
        if found is None:
            raise UserError(
                f"{run_dir}: no loadable checkpoint", "train the run first, or pass checkpoint=PATH"
            )
        path, payload = found
    built = registry.get("models", cfg.model.name).factory(**payload["model_args"])
    models = built if isinstance(built, dict) else {"model": built}
    for name, m in models.items():
        m.load_state_dict(payload["models"][name])
        m.to(device).eval()
    return models["model"] if list(models) == ["model"] else models
