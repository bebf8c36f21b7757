"""`expctl.run` inside a larger program leaves the program as it found it."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import conftest
import pytest
import torch

import expctl

SMALL = [
    *conftest.SMALL,
    "train.max_steps=2",
    "env.EXPCTL_API_PROBE=set-by-the-run",
]


def _state() -> dict[str, Any]:
    logger = logging.getLogger("expctl")
    return {
        "signals": {
            s: signal.getsignal(s)
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR2)
        },
        "environ": dict(os.environ),
        "sys.path": list(sys.path),
        "flags": (
            torch.get_float32_matmul_precision(),
            torch.backends.cudnn.benchmark,
            torch.get_num_threads(),
        ),
        "torch rng": torch.get_rng_state().clone(),
        "python rng": random.getstate(),
        "logger": (list(logger.handlers), logger.level, logger.propagate),
    }


def _same(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in before:
        if key == "torch rng":
            assert torch.equal(before[key], after[key]), key
        else:
            assert before[key] == after[key], key


def _mine(signum: int, frame: Any) -> None:
    """The host program's own handler."""


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A host program in its own folder, with its own SIGTERM and SIGUSR2 handlers."""
    monkeypatch.chdir(tmp_path)
    previous = {sig: signal.signal(sig, _mine) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_an_inline_run_restores_signals_environment_flags_rng_and_logging(host: None) -> None:
    before = _state()
    result = expctl.run(None, [*SMALL, "launcher=inline"])
    assert result["step"] == 2
    _same(before, _state())
    assert "EXPCTL_API_PROBE" not in os.environ


def test_a_failing_run_restores_them_too(host: None) -> None:
    before = _state()
    with pytest.raises(expctl.UserError):
        expctl.run(None, [*SMALL, "optim.lr=1e30"])  # a non-finite loss, after the env is applied
    _same(before, _state())


@pytest.mark.slow
def test_a_local_launch_gives_back_the_callers_signal_handlers(host: None) -> None:
    before = _state()
    result = expctl.run(None, [*SMALL, "launcher=local", "launcher.nproc=2"])
    assert result["step"] == 2
    _same(before, _state())
    assert signal.getsignal(signal.SIGTERM) is _mine
