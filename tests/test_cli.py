"""The command line: help without torch, list/show, start-up, and the bad-input corpus."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, cli_env
from conftest import expctl as run_cli

from expctl import cli
from expctl.builtin import catalogue


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


@pytest.mark.parametrize("where", ["before the run directory", "in the run", "before a checkpoint"])
def test_ctrl_c_says_how_to_resume_only_when_there_is_a_run_to_resume(
    where: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 130 either way; before a run directory was chosen (imports, composition) there is
    nothing to resume, so no "to resume from the last checkpoint" (it used to say so); in a run
    that saved no checkpoint yet, the same command starts over."""
    from expctl import api, startup
    from expctl.errors import Interrupted

    def interrupted(*_: object, **__: object) -> None:
        if where != "before the run directory":
            saved = where == "in the run"
            raise Interrupted("run the same command with run.dir=/tmp/r", saved=saved)
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "run", interrupted)
    monkeypatch.setattr(startup, "_ONE_RUN", startup._ONE_RUN)  # `run` sets it: restored after
    assert cli.main(["run"]) == 130
    err = capsys.readouterr().err.strip()
    if where == "in the run":
        assert err == (
            "expctl: interrupted; to resume from the last checkpoint: "
            "run the same command with run.dir=/tmp/r"
        )
    elif where == "before a checkpoint":
        assert err == (
            "expctl: interrupted before its first checkpoint, nothing to resume: "
            "run the same command with run.dir=/tmp/r to start over"
        )
    else:
        assert err == "expctl: interrupted"


def test_sigterm_before_a_run_directory_is_one_line_and_exit_143(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`expctl run` turns SIGTERM into an exception while it runs (the default ended it without
    a word); one that lands before a run directory exists (composing) says only what stopped
    it, exit 143, and the process's own handler is back afterwards."""
    import os
    import signal

    from expctl import api, startup

    before = signal.getsignal(signal.SIGTERM)

    def composing(*_: object, **__: object) -> None:
        # (without a handler of its own, the signal would end pytest)
        assert signal.getsignal(signal.SIGTERM) not in (before, signal.SIG_DFL), "no handler"
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(api, "run", composing)
    monkeypatch.setattr(startup, "_ONE_RUN", startup._ONE_RUN)  # `run` sets it: restored after
    assert cli.main(["run"]) == 143
    assert capsys.readouterr().err == "expctl: stopped by SIGTERM\n"
    assert signal.getsignal(signal.SIGTERM) is before


def test_workers_stopped_before_their_first_checkpoint_are_not_said_to_keep_one(
    tmp_path: Path,
) -> None:
    """The launcher's last line for local workers stopped by a signal (SIGTERM to it, or every
    worker exiting 3 or 143) promises checkpoints only where one was written: stopped while
    still starting, the run has none, and the same command starts over. The message is tested
    here directly; a real SIGTERM lands before the first checkpoint only by timing."""
    from expctl.errors import EXIT_PREEMPTED, EXIT_TERMINATED
    from expctl.jobs import agent
    from expctl.layout import RunDir

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    again = f"run the same command with run.dir={run}"
    before = agent._failure({0: EXIT_TERMINATED, 1: EXIT_TERMINATED}, 0, run)
    assert str(before) == (
        f"stopped by SIGTERM before its first checkpoint, nothing to resume: {again} to start over"
    )
    assert "kept" not in RunDir(run).stopped("the stop signal")
    RunDir(run).checkpoints.mkdir()
    RunDir(run).checkpoint(4).write_bytes(b"")
    after = agent._failure({0: EXIT_PREEMPTED, 1: EXIT_PREEMPTED}, 0, run)
    assert str(after) == f"stopped by the stop signal; its checkpoints are kept: {again} to resume"


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
    # launcher=local: the ranks it will start, not this one process's environment
    assert cli.main(["show", "-C", str(f), "launcher=local", "launcher.nproc=3"]) == 0
    out = capsys.readouterr().out
    assert "# environment: launcher=local starts 3 rank(s) on this machine (world_size=3)" in out


@pytest.mark.slow
@pytest.mark.parametrize("args", [["run", "train.precision=fp8"], ["run", "-C", "missing.yml"]])
def test_real_process_exit_code_and_no_traceback(args: list[str], tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "HINT:" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(("args", "first"), [("list models", "models:"), ("run --help", "usage:")])
def test_output_piped_into_head_ends_quietly(args: str, first: str) -> None:
    proc = subprocess.run(
        f"{sys.executable} -m expctl {args} | head -1",
        shell=True,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.startswith(first) and proc.stderr == "", proc.stderr


@pytest.mark.slow
def test_status_of_a_local_run_tells_unfinished_from_completed(tiny: Path) -> None:
    args = ["run", "-C", str(tiny), "imports=[faulty]", "train.step=kill_at_step", "run.dir=r"]
    killed = run_cli(*args, cwd=tiny.parent, env=cli_env(KILL_AT_STEP="12"), check=False)
    assert killed.returncode == -9
    state = run_cli("status", "r", cwd=tiny.parent).stdout
    assert "state     unfinished, last written" in state and "resumes it" in state, state
    run_cli(*args, cwd=tiny.parent)
    assert "state     completed" in run_cli("status", "r", cwd=tiny.parent).stdout


@pytest.mark.slow
def test_imports_next_to_the_config_file_work_from_any_directory(tmp_path: Path) -> None:
    """`imports: [near_model]` with near_model.py beside the -C file, run from elsewhere, with
    two local workers (they must find it too)."""
    cfg_dir, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    cfg_dir.mkdir()
    elsewhere.mkdir()
    (cfg_dir / "near_model.py").write_text(
        "from torch import nn\nfrom expctl import register\n\n"
        "@register('models', 'near_linear')\n"
        "def near_linear(num_classes: int = 4) -> nn.Module:\n"
        "    '''Linear model from a module beside the config.'''\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(20, num_classes))\n"
    )
    (cfg_dir / "exp.yml").write_text(
        "imports: [near_model]\nmodel: {name: near_linear}\n"
        "data: {name: synthetic, shape: [20], num_classes: 4, num_samples: 256, batch_size: 32}\n"
        "train: {max_steps: 4}\n"
    )
    run_cli(
        "run",
        "-C",
        str(cfg_dir / "exp.yml"),
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=r",
        cwd=elsewhere,
        fresh=True,  # the module search path is what start-up sets
    )
    assert (elsewhere / "r" / "result.json").is_file()


SHADOW = "raise RuntimeError('the torchvision.py of the working directory was imported')\n"


@pytest.mark.slow
def test_a_torchvision_py_in_the_working_directory_shadows_nothing(tmp_path: Path) -> None:
    """The working directory is searched after site-packages: its torchvision.py is never
    imported, while a module of yours there is still found."""
    (tmp_path / "torchvision.py").write_text(SHADOW)
    (tmp_path / "mine.py").write_text(
        "from expctl import register\n\n@register('models', 'mine')\n"
        "def mine(num_classes: int = 4) -> object:\n    return None\n"
    )
    out = run_cli("show", "model=resnet18", cwd=tmp_path, fresh=True).stdout
    assert "name: resnet18" in out
    out = run_cli("show", "imports=[mine]", "model=mine", cwd=tmp_path, fresh=True).stdout
    assert "name: mine" in out


# what a working directory may hold: stdlib names, expctl itself, torchvision, and optional
# packages that are not installed, which torch imports when it finds them (colorama: inductor)
POISONED = ("json", "copy", "dataclasses", "difflib", "expctl", "torchvision", "dill", "pynvml",
            "colorama")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "config"),
    [("inline", "r.yml"), ("local", "r.yml"), ("local", "expctl/r.yml")],
    ids=["inline", "local", "local-config-folder-named-expctl"],
)
def test_modules_in_the_working_directory_are_not_imported(
    tmp_path: Path, launcher: str, config: str
) -> None:
    """DESIGN.md trap 14: `expctl run` and its local workers search only what the user named
    (PYTHONPATH; `imports:` in the working directory and beside the -C file), never the working
    directory by itself: none of its json.py, expctl.py or dill.py runs, and a config folder
    named expctl/ does not stand in for expctl."""
    for name in POISONED:
        if name == "expctl" and config.startswith("expctl/"):
            continue  # expctl.py would win over the folder
        marker = tmp_path / f"imported_{name}"
        (tmp_path / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'w').close()\n"
            f"raise ImportError('the {name}.py of the working directory')\n"
        )
    (tmp_path / config).parent.mkdir(exist_ok=True)
    (tmp_path / config).write_text(
        "model: {name: resnet18}\ntrain: {max_steps: 1}\n"
        "data: {name: synthetic, shape: [3, 16, 16], num_classes: 2, num_samples: 32, "
        "val_samples: 8, batch_size: 8}\n"
    )
    script = Path(sys.executable).with_name("expctl")  # the console script, as users start it
    args = ["run", "-C", config, f"launcher={launcher}", "run.dir=r"]
    args += ["launcher.nproc=2"] if launcher == "local" else []
    proc = subprocess.run(
        [str(script), *args], cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.glob("imported_*")) == []
    assert (tmp_path / "r" / "result.json").is_file()


@pytest.mark.slow
def test_log_lines_number_the_first_epoch_1_in_train_and_val_lines(tiny: Path) -> None:
    run_cli("run", "-C", str(tiny), "train.max_epochs=1", "run.dir=r", cwd=tiny.parent)
    lines = (tiny.parent / "r" / "train.log").read_text().splitlines()
    train = [x for x in lines if " train epoch " in x]
    val = [x for x in lines if " val epoch " in x]
    assert train and val and all(" epoch 1 step " in x for x in train + val), lines


# Commands that only read files, with what each must never import (as pyproject's forbidden
# contracts say): a new one (`expctl runs`) goes here and under the contract in pyproject.toml.
READ_ONLY_COMMANDS = {
    "status {run}": ("torch", "torchvision", "hydra", "optuna", "submitit"),
    "sweep table {sweep}": ("torch", "torchvision", "submitit"),  # the journal is Optuna's
    "sweep table --csv {sweep}": ("torch", "torchvision", "submitit"),
    "runs {sweep}": ("torch", "torchvision", "hydra", "optuna", "submitit"),
    "diff {run} {sweep}/trial_001": ("torch", "torchvision", "hydra", "optuna", "submitit"),
}
HEAVY_AFTER = """\
import runpy, sys
heavy, sys.argv = sys.argv[1].split(","), ["expctl", *sys.argv[2:]]
try:
    runpy.run_module("expctl", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("imported:", sorted(m for m in heavy if m in sys.modules))
"""


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A finished grid sweep of two 2-step trials: the working directory and the sweep's path."""
    cwd = tmp_path_factory.mktemp("readonly")
    (cwd / "tiny.yml").write_text(TINY)
    args = ["run", "-C", "tiny.yml", "-m", "optim.lr=0.01,0.1", "train.max_steps=2"]
    out = run_cli(*args, cwd=cwd).stdout
    return cwd, re.search(r"sweep directory (\S+)", out).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(READ_ONLY_COMMANDS))
def test_read_only_commands_import_no_torch(command: str, small_sweep: tuple[Path, str]) -> None:
    cwd, sweep = small_sweep
    args = command.format(run=f"{sweep}/trial_000", sweep=sweep).split()
    heavy = READ_ONLY_COMMANDS[command]
    proc = subprocess.run(
        [sys.executable, "-c", HEAVY_AFTER, ",".join(heavy), *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "imported: []", proc.stdout
    assert len(proc.stdout.splitlines()) > 2, proc.stdout  # it printed what it read


@pytest.mark.slow
def test_sweep_table_of_an_ended_sweep_reads_no_journal_again_until_a_file_changes(
    small_sweep: tuple[Path, str], tmp_path: Path
) -> None:
    cwd, sweep = small_sweep
    copy = tmp_path / "copied"
    shutil.copytree(sweep, copy)
    heavy = ("optuna", "hydra", "omegaconf")

    def table() -> tuple[str, str]:
        proc = subprocess.run(
            [sys.executable, "-c", HEAVY_AFTER, ",".join(heavy), "sweep", "table", str(copy)],
            cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        *shown, imported = proc.stdout.splitlines()
        return "\n".join(shown), imported

    first, imported = table()
    assert imported != "imported: []"  # read from the journal
    again, imported = table()
    assert again == first
    assert imported == "imported: []", "the trials ended: what was read of them is kept"
    with open(copy / "trial_001" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "epoch": 1, "val/acc": 0.987654}\n')
    changed, imported = table()
    assert "0.9877" in changed and imported != "imported: []", changed


def test_the_list_cache_key_changes_with_versions_and_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    src = tmp_path / "expctl"
    src.mkdir()
    (src / "models.py").write_text("x = 1\n")
    monkeypatch.setattr(catalogue, "__file__", str(src / "builtin" / "catalogue.py"))
    first = catalogue.key()
    assert catalogue.key() == first
    (src / "models.py").write_text("x = 22\n")
    assert catalogue.key() != first, "an edited source file"
    edited = catalogue.key()
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda d: "9.9" if d == "torchvision" else real(d)
    )
    assert catalogue.key() != edited, "another torchvision"
