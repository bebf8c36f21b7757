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


# (command-line arguments, text the error must contain); files are written by `files` below
CORPUS: list[tuple[list[str], str]] = [
    (["run", "-C", "missing.yml"], "no such file"),
    (["run", "-C", "notes.txt"], "must end in .yml or .yaml"),
    (["run", "-C", "broken.yml"], "not valid YAML"),
    (["run", "-C", "list.yml"], "must hold a mapping"),
    (["run", "-C", "unreadable.yml"], "cannot read it"),
    (["run", "-C", "typo_section.yml"], "Did you mean 'train'"),
    (["run", "-C", "typo_key.yml"], "Did you mean 'max_epochs'"),
    (["run", "-C", "bad_default.yml"], "Did you mean 'resnet18'"),
    (["run", "model=resnet19"], "Did you mean 'resnet18'"),
    (["run", "model.name=transformer9000"], "unknown model name 'transformer9000'"),
    (["run", "data.name=fashion"], "Did you mean 'fashion_mnist'"),
    (["run", "optim.name=adamm"], "Did you mean 'adam'"),
    (["run", "sched=cosinee"], "Did you mean 'cosine'"),
    (["run", "loss.name=crossentropy"], "Did you mean 'cross_entropy'"),
    (["run", "train.step=supervise"], "Did you mean 'supervised'"),
    (["run", "optim.lrr=0.1"], "Did you mean 'lr'"),
    (["run", "train.max_epochs=0"], "below the minimum 1"),
    (["run", "train.max_epochs=-3"], "below the minimum 1"),
    (["run", "data.batch_size=0"], "below the minimum 1"),
    (["run", "train.max_epochs=ten"], "expected int"),
    (["run", "train.precision=fp8"], "not one of: auto, 32, bf16, 16"),
    (["run", "train.device=tpu"], "not one of: auto, cpu, cuda"),
    (["run", "optim.lr=fast"], "optim.lr: expected float"),
    (["run", "data.root=/nonexistent/fm"], "Fashion-MNIST not found"),
    (["run", "data.root=corrupt_data"], "truncated or corrupt"),
    (["run", "imports=[no_such_module_xyz]"], "cannot import module"),
    (["run", "launcher.nproc=2"], "launcher=local"),
    (["run", "launcher=local", "launcher.nproc=0"], "below the minimum 1"),
    (["run", "launcher=nowhere"], "no 'nowhere' in config group 'launcher'"),
    (["run", "checkpoint.resume=/nope.pt"], "no checkpoint at"),
    (["run", "data=synthetic", "data.batch_size=100000"], "larger than the"),
    (["run", "sched=multistep", "~sched.milestones"], "needs argument 'milestones'"),
    (["run", "optim.lr=[1,2"], "bad override"),
    (["run", "run.dir=a_file"], "exists and is not a directory"),
]


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    (tmp_path / "notes.txt").write_text("model: cnn\n")
    (tmp_path / "broken.yml").write_text("model: {name: cnn\ntrain: [\n")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    unreadable = tmp_path / "unreadable.yml"
    unreadable.write_bytes(b"\xff\xfe\x00bad")
    (tmp_path / "typo_section.yml").write_text("trian:\n  max_epochs: 2\n")
    (tmp_path / "typo_key.yml").write_text("train:\n  max_epoch: 2\n")
    (tmp_path / "bad_default.yml").write_text("defaults:\n  - model: resnet19\n")
    (tmp_path / "a_file").write_text("not a directory")
    bad = tmp_path / "corrupt_data"
    bad.mkdir()
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (bad / name).write_bytes(b"\x00\x00\x08\x03" + (5).to_bytes(4, "big") * 3 + b"\x00" * 10)
    (bad / "train-labels-idx1-ubyte").write_bytes(
        b"\x00\x00\x08\x01" + (5).to_bytes(4, "big") + b"\x00" * 5
    )
    return tmp_path


@pytest.mark.parametrize(("args", "expected"), CORPUS, ids=[" ".join(a)[:60] for a, _ in CORPUS])
def test_bad_input_is_a_short_error_with_exit_2_and_nothing_on_disk(
    args: list[str],
    expected: str,
    corpus_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(corpus_dir)
    before = sorted(p.name for p in corpus_dir.iterdir())
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2 and lines[0].startswith("expctl: error: "), err
    assert len(lines) == 1 or lines[1].startswith("  HINT: "), err
    assert "Traceback" not in err
    assert sorted(p.name for p in corpus_dir.iterdir()) == before, "nothing half-written on disk"


@pytest.mark.parametrize("args", [["run", "train.precision=fp8"], ["run", "-C", "missing.yml"]])
def test_real_process_exit_code_and_no_traceback(args: list[str], tmp_path: Path) -> None:
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "HINT:" in proc.stderr
    assert list(tmp_path.iterdir()) == []
