"""The command line: help without torch, list/show, packaging, and the bad-input corpus."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_env
from conftest import expctl as run_cli

from expctl import cli


def test_help_imports_neither_torch_nor_hydra() -> None:
    code = (
        "import sys; from expctl.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n"
        "print('torch' in sys.modules, 'hydra' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "False False"
    assert "expctl run -C my.yml" in out.stdout


def test_list_shows_names_descriptions_and_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert "resnet18" in out and "num_classes: int" in out and "Small CNN" in out
    convnext = out.split("convnext_tiny", 1)[1].split("\n  ", 2)[1]
    assert "stochastic_depth_prob" in convnext and "norm_layer" not in convnext, (
        "arguments YAML cannot set are not listed"
    )
    assert cli.main(["list", "optim"]) == 0 and "adamw" in capsys.readouterr().out


def test_show_prints_resolved_config_and_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "x.yml"
    f.write_text("defaults: [{model: resnet18}]\ntrain: {max_epochs: 7}\n")
    assert cli.main(["show", "-C", str(f), "optim.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "name: resnet18" in out and "max_epochs: 7" in out and "lr: 0.5" in out
    assert "# environment: rank=0" in out and "source=single" in out
    assert not (tmp_path / "runs").exists()


def test_non_editable_install_finds_builtin_configs(tmp_path: Path) -> None:
    """conf/ ships inside the wheel: `expctl show` works from any directory."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (target / "expctl" / "conf" / "config.yaml").is_file()
    env = cli_env(PYTHONPATH=str(target))
    out = subprocess.run(
        [sys.executable, "-m", "expctl", "show", "experiment=dcgan"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "name: dcgan" in out.stdout
    import_path = subprocess.run(
        [sys.executable, "-c", "import expctl; print(expctl.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert import_path.startswith(str(target))


@pytest.mark.parametrize("args", [["run", "train.precision=fp8"], ["run", "-C", "missing.yml"]])
def test_real_process_exit_code_and_no_traceback(args: list[str], tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "HINT:" in proc.stderr
    assert list(tmp_path.iterdir()) == []
