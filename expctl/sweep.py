"""Sweeps: Hydra multirun over the same composition as a single run; each trial is a run."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expctl.errors import UserError

log = logging.getLogger("expctl")


def _root(overrides: Sequence[str]) -> Path:
    for o in overrides:
        if o.startswith("run.root="):
            return Path(o.split("=", 1)[1]).expanduser().absolute()
    return Path("runs").absolute()


def new_sweep_dir(root: Path) -> Path:
    """Create a fresh sweep directory atomically (two sweeps never share one)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o750)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        path = root / f"sweep-{stamp}-{secrets.token_hex(2)}"
        try:
            path.mkdir(mode=0o750)
            return path
        except FileExistsError:
            continue
    raise UserError(f"could not create a sweep directory under {root}", "check run.root")


def multirun(config_file: str | None, overrides: Sequence[str]) -> Path:
    """Run every combination of the overrides as its own run inside one sweep directory."""
    from expctl import compose, launch
    from expctl.config import validate

    # validate the first combination before anything is created on disk
    first = [
        o.split("=", 1)[0] + "=" + o.split("=", 1)[1].split(",")[0] if "=" in o else o
        for o in overrides
    ]
    validate(compose.compose(config_file, first))
    sweep_dir = new_sweep_dir(_root(overrides))
    print(f"expctl: sweep directory {sweep_dir}", flush=True)
    rows: list[tuple[str, str]] = []

    def trial(container: dict[str, Any], trial_dir: Path) -> Any:
        from hydra.core.hydra_config import HydraConfig

        label = " ".join(HydraConfig.get().overrides.task) or "(defaults)"
        cfg = validate(container).replace("run", dir=str(trial_dir))
        try:
            result = launch.launch(cfg)
        except UserError:
            raise
        except Exception as e:  # a failing trial does not end the sweep
            log.error("trial %s failed: %s", trial_dir.name, e)
            rows.append((label, f"failed: {str(e).splitlines()[0][:80]}"))
            return None
        rows.append(
            (
                label,
                "  ".join(
                    f"{k}={v:.4g}" for k, v in result.metrics.items() if k.startswith("val/")
                ),
            )
        )
        return result

    compose.multirun(
        config_file,
        [*overrides, f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=${hydra.job.num}"],
        trial,
    )
    for label, text in rows:
        print(f"  {label:<40} {text}")
    return sweep_dir
