"""Shared helpers: run the real CLI in a subprocess, small configs on synthetic data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
sys.path.insert(0, str(PLUGINS))  # in-process tests import the same plugins as `imports:` does

TINY = """\
model: {name: mlp, hidden: [32]}
data: {name: synthetic, shape: [20], num_classes: 4, num_samples: 512, val_samples: 128, batch_size: 32}
optim: {name: sgd, lr: 0.1, momentum: 0.9}
sched: {name: null}
train: {max_epochs: 2, log_every: 4}
"""


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for CLI subprocesses: test plugins importable, no inherited rank variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "TORCHELASTIC_"))
    }
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
    ):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env.update(extra)
    return env


def expctl(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m expctl ARGS` in `cwd`; fail with its output when `check` and it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "expctl", *args],
        cwd=cwd,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"expctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A small config file (.yml) on synthetic data, in a fresh working directory."""
    path = tmp_path / "tiny.yml"
    path.write_text(TINY)
    return path


def run_dirs(root: Path) -> list[Path]:
    """Run directories (those holding config.yaml) under `root`."""
    return sorted(p.parent for p in root.rglob("config.yaml"))
