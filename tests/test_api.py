"""`expctl.run` inside a larger program leaves the program as it found it."""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import subprocess
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


@pytest.mark.slow
def test_load_model_finds_the_module_that_sat_beside_the_config_file(neighbour: Path) -> None:
    """The run found `imports: [neighbour_models]` beside its -C file (and was started from
    another directory); Python started in a third one loads its model, leaving its module
    search path in its order, and once the module is gone the error names it and where it was."""
    root = neighbour.parent.parent
    proc = conftest.expctl("run", "-C", str(neighbour), "train.max_steps=2", cwd=root / "elsewhere")
    run_dir = re.search(r"results in (\S+)", proc.stdout).group(1)  # type: ignore[union-attr]
    code = (
        "import sys, expctl\npath = list(sys.path)\n"
        f"m = expctl.load_model({run_dir!r})\n"
        "assert sys.path[: len(path)] == path, ('the caller sys.path changed', sys.path)\n"
        "print(m[1].out_features)\n"
    )

    def load() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=root,
            env=conftest.cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )

    loaded = load()
    assert loaded.returncode == 0 and loaded.stdout.strip() == "8", loaded.stderr
    impostor = root / "neighbour_models.py"  # same name, in the directory Python starts in
    impostor.write_text(
        conftest.NEIGHBOUR.replace("8), nn.ReLU(), nn.Linear(8,", "5), nn.ReLU(), nn.Linear(5,")
    )
    loaded = load()
    assert loaded.returncode == 0 and loaded.stdout.strip() == "8", (
        "the recorded module, not the impostor"
    )
    impostor.unlink()
    module = neighbour.with_name("neighbour_models.py")
    module.rename(module.with_name("renamed.py"))
    gone = load()
    assert gone.returncode != 0
    assert (
        f"cannot import module 'neighbour_models': the run imported it from {module}, "
        "which is gone" in gone.stderr
    ), gone.stderr


@pytest.mark.parametrize("call", ["run", "evaluate"])
def test_overrides_as_one_string_are_refused_naming_the_list_to_pass(call: str) -> None:
    """A string is a sequence of one-character overrides ("bad override 'o'"): refused."""
    calls = {
        "run": lambda o: expctl.run(None, o),
        "evaluate": lambda o: expctl.evaluate("no_run", overrides=o),
    }
    with pytest.raises(expctl.UserError, match="'optim.lr=0.1' is one string") as e:
        calls[call]("optim.lr=0.1")
    assert e.value.hint == "pass a list, one override per item: overrides=['optim.lr=0.1']"
    with pytest.raises(expctl.UserError, match="overrides: 0.1 is not a string"):
        calls[call](["optim.lr=0.1", 0.1])
    with pytest.raises(expctl.UserError, match="overrides: None is not a string"):
        calls[call](None)
