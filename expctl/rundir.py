"""The run directory: decided once, created atomically, written by rank 0 only.

Its name comes from ``run.dir`` when set, else from an id every rank knows without talking (the
Slurm job id, or the id a launcher passes down), else from the time plus a random suffix; the
folder is made with ``mkdir`` (atomic), so two runs started in the same second never share one.
An existing run directory is reused (to resume) only when its frozen config matches, and a new
launch continues the run it holds only with checkpoint.resume=auto (restarts within a launch,
elastic or Slurm requeue, always continue it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import Any

from expctl import config as config_mod
from expctl.config import Config
from expctl.errors import UserError
from expctl.layout import RunDir

# keys that may change between an interrupted run and its continuation
RESUMABLE_CHANGES = (
    "train.max_epochs",
    "train.max_steps",
    "train.log_every",
    "launcher.",
    "checkpoint.",
    "env.",
)


def deterministic_dir(cfg: Config, run_id: str | None) -> Path | None:
    """The run directory every rank can compute alone, or None when one must be invented."""
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().absolute()
    if run_id:
        return Path(cfg.run.root).expanduser().absolute() / f"{_safe(cfg.run.name)}-{_safe(run_id)}"
    return None


def _safe(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in str(text)).strip("._")
    return out or "run"


def create(cfg: Config, run_id: str | None = None, restart: bool = False) -> Config:
    """Create (or reopen, to resume) the run directory and write config.yaml into it.

    Args:
        restart: this process restarts a launch already under way (elastic restart, Slurm
            requeue), which continues the run whatever checkpoint.resume says.

    Returns:
        The config with ``run.dir`` set to the absolute path of the directory.

    Raises:
        UserError: the directory holds another run's config, holds a run that
            checkpoint.resume=never or PATH would start over, or cannot be created.
    """
    path = deterministic_dir(cfg, run_id)
    if path is None:
        path = _new_unique(Path(cfg.run.root).expanduser().absolute(), _safe(cfg.run.name))
        created = True
    else:
        created = _make(path)
    frozen = cfg.replace("run", dir=str(path))
    try:
        _write_config(path, frozen, fresh=created, restart=restart)
    except BaseException:
        if created:
            _remove_if_empty(path)
        raise
    return frozen


def _make(path: Path) -> bool:
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        path.mkdir(mode=0o750)
        return True
    except FileExistsError:
        if not path.is_dir():
            raise UserError(
                f"run.dir {path} exists and is not a directory", "pick another run.dir"
            ) from None
        return False
    except OSError as e:
        raise UserError(
            f"cannot create run directory {path}: {e.strerror}", "check run.root / run.dir"
        ) from None


def _new_unique(root: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        path = root / f"{name}-{stamp}-{secrets.token_hex(2)}"
        if _make(path):
            return path
    raise UserError(f"could not create a fresh run directory under {root}", "check run.root")


def _write_config(path: Path, cfg: Config, fresh: bool, restart: bool) -> None:
    target = RunDir(path).config
    text = config_mod.to_yaml(cfg)
    if not fresh and target.exists():
        old = config_mod.load(path)
        diff = _differences(old.to_dict(), cfg.to_dict())
        blocking = [k for k in diff if not k.startswith(RESUMABLE_CHANGES)]
        if blocking:
            newest = RunDir(path).checkpoint_files()
            raise UserError(
                f"run.dir={path} holds a run with a different config: "
                + _describe(blocking, old.to_dict(), cfg.to_dict()),
                "use a new run.dir"
                + (
                    "; to start from its last checkpoint (weights, optimizer state, step): "
                    f"checkpoint.resume={newest[0]}"
                    if newest
                    else ""
                ),
            )
        resume = cfg.checkpoint.resume
        step = _progress(path)
        if resume != "auto" and not restart and step is not None:
            raise UserError(
                f"run.dir={path} already holds a run (step {step}); "
                f"checkpoint.resume={resume} would overwrite it",
                "use a new run.dir, or checkpoint.resume=auto to continue it",
            )
        if not diff:
            return
    elif not fresh and any(path.iterdir()):
        raise UserError(
            f"run.dir {path} is not empty and holds no config.yaml", "pick an empty or new run.dir"
        )
    tmp = path / f".{RunDir.CONFIG}.tmp-{os.getpid()}"
    tmp.write_text(text)
    os.chmod(tmp, 0o640)
    os.replace(tmp, target)


def _progress(path: Path) -> int | None:
    """The step the run in `path` reached (newest checkpoint, else last metrics row), or None
    when it holds no run yet (a fresh directory, or one only created for a launch)."""
    newest = RunDir(path).checkpoint_files()
    if newest:
        return int(newest[0].stem.removeprefix("step_"))
    if not RunDir(path).metrics.is_file() or not RunDir(path).metrics.stat().st_size:
        return None
    rows = RunDir(path).metric_rows()
    try:
        return int(rows[-1]["step"]) if rows else 0
    except (ValueError, KeyError, TypeError):
        return 0


def _describe(keys: list[str], old: dict[str, Any], new: dict[str, Any], shown: int = 3) -> str:
    """'optim.lr=0.1 there, 0.01 here' for the first `shown` keys, and how many more differ."""
    parts = [f"{k}={_get(old, k)} there, {_get(new, k)} here" for k in keys[:shown]]
    more = f" (and {len(keys) - shown} more)" if len(keys) > shown else ""
    return "; ".join(parts) + more


def _get(tree: dict[str, Any], dotted: str) -> str:
    value: Any = tree
    for part in dotted.split("."):
        value = value.get(part, "unset") if isinstance(value, dict) else "unset"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out: list[str] = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}")
    return out


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def discard_if_unstarted(path: Path) -> None:
    """Remove a run directory that a user error stopped before it trained anything: no
    checkpoint, no result, no metrics (nothing half-written stays behind)."""
    import shutil

    run = RunDir(path)
    if (run.checkpoints.is_dir() and any(run.checkpoints.glob("*.pt"))) or run.result.exists():
        return
    if run.metrics.exists() and run.metrics.stat().st_size > 0:
        return
    for file in (run.config, run.trial, run.log, run.metrics):
        file.unlink(missing_ok=True)
    for folder in (run.tb, run.checkpoints):
        shutil.rmtree(folder, ignore_errors=True)
    _remove_if_empty(path)
    _remove_if_empty(path.parent)  # the runs/ root, when this run made it
