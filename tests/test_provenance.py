"""RUN_DIR/provenance.json from real CLI runs in a git repository made here (and outside one, and
without git), and what a Slurm job's code snapshot holds for each `launcher.snapshot`."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from pathlib import Path

import pytest
import torch
from conftest import SNAPMOD, TINY, cli_env, git, user_repo
from conftest import expctl as run_cli

import expctl
from expctl import api
from expctl.config import compose
from expctl.errors import UserError
from expctl.jobs import snapshot
from expctl.rank.provenance import Launch


def provenance(run_dir: Path) -> dict:
    return json.loads((run_dir / "provenance.json").read_text())


@pytest.mark.slow
def test_a_run_records_its_command_code_machine_and_packages(tmp_path: Path) -> None:
    repo = user_repo(tmp_path / "repo")
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "snapmod.py").write_text(SNAPMOD.format(version=2))  # not committed
    (repo / "notes.txt").write_text("untracked")
    args = ["run", "-C", "tiny.yml", "train.max_epochs=1", "run.dir=runs/a"]
    env = cli_env(EXPCTL_TEST_SECRET="hunter2")
    run_cli(*args, cwd=repo, env=env)
    run_dir = repo / "runs" / "a"
    (launch,) = provenance(run_dir)["launches"]
    assert launch["argv"][1:] == args and launch["cwd"] == str(repo)
    assert launch["config_file"] == str(repo / "tiny.yml")
    assert launch["overrides"] == ["train.max_epochs=1", "run.dir=runs/a"]
    assert launch["git"] == {
        "root": str(repo),
        "commit": commit,
        "branch": "main",
        "dirty": True,
        "untracked": ["notes.txt"],
        "untracked_count": 1,
        "diff_truncated": False,
    }
    diff = (run_dir / launch["diff_file"]).read_text()
    assert "-VERSION = 1\n+VERSION = 2" in diff, "the uncommitted diff, as `git apply` takes it"
    assert launch["snapshot"] is None, "no copy of the code for a run that starts now"
    (attempt,) = launch["attempts"]
    assert attempt["host"] == socket.gethostname() and attempt["cpus"] == os.cpu_count()
    assert attempt["python"] == ".".join(map(str, sys.version_info[:3]))
    assert attempt["versions"]["torch"] == torch.__version__.split("+")[0]
    assert attempt["versions"]["expctl"] == expctl.__version__
    assert attempt["started_by"] == "inline" and attempt["restart"] == 0
    assert attempt["slurm"] is None and isinstance(attempt["gpus"], list)
    assert "hunter2" not in (run_dir / "provenance.json").read_text(), "no environment values"
    status = run_cli("status", "runs/a", cwd=repo).stdout
    line = f"code      git {commit[:12]} (main), dirty ({launch['diff_file']}); on host"
    assert line in status

    # continued by a second command: a second launch; the same command again trains nothing
    run_cli("run", "-C", "tiny.yml", "train.max_epochs=2", "run.dir=runs/a", cwd=repo)
    launches = provenance(run_dir)["launches"]
    assert [x["overrides"][0] for x in launches] == ["train.max_epochs=1", "train.max_epochs=2"]
    assert [len(x["attempts"]) for x in launches] == [1, 1]
    before = (run_dir / "provenance.json").read_text()
    run_cli("run", "-C", "tiny.yml", "train.max_epochs=2", "run.dir=runs/a", cwd=repo)
    assert (run_dir / "provenance.json").read_text() == before, "a completed run records nothing"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["no repository", "no git"])
def test_without_a_repository_or_git_a_run_still_records_the_rest(
    tmp_path: Path, where: str
) -> None:
    (tmp_path / "tiny.yml").write_text(TINY)
    env = cli_env(GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    if where == "no git":  # a repository, but no git on PATH
        user_repo(tmp_path / "repo")
        env["PATH"] = str(Path(sys.executable).parent)
    cwd = tmp_path / "repo" if where == "no git" else tmp_path
    run_cli(
        "run", "-C", str(tmp_path / "tiny.yml"), "train.max_epochs=1", "run.dir=r", cwd=cwd, env=env
    )
    (launch,) = provenance(cwd / "r")["launches"]
    assert launch["git"] is None and "diff_file" not in launch
    assert launch["attempts"][0]["host"] == socket.gethostname()
    status = run_cli("status", str(cwd / "r"), cwd=cwd).stdout
    assert "code      no git repository; on host" in status


def _plan(repo: Path, module: str, *overrides: str) -> snapshot.Plan | None:
    """The snapshot a launcher=slurm job of repo/tiny.yml would get (composed in this process)."""
    with api.caller_state_kept():
        cfg = compose.compose(str(repo / "tiny.yml"), ["launcher=slurm", *overrides])
        try:
            return snapshot.plan(cfg, Launch.here(str(repo / "tiny.yml")))
        finally:
            sys.modules.pop(module, None)


@pytest.mark.slow
def test_the_snapshot_is_switchable_and_copies_only_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"snap_{secrets.token_hex(4)}"  # each test imports its own
    repo = user_repo(tmp_path / "repo", module)
    (repo / "pkg").mkdir()
    (repo / "pkg" / "helpers.py").write_text("X = 1\n")
    (repo / "runs").mkdir()
    (repo / "runs" / "old.txt").write_text("a run's file")  # ignored by git
    git(repo, "add", "pkg")
    git(repo, "commit", "-q", "-m", "helpers")
    monkeypatch.chdir(tmp_path)
    assert _plan(repo, module, "launcher.snapshot=none") is None
    auto = _plan(repo, module)
    assert auto is not None and auto.mode == "git" and auto.paths == (".",)
    assert sorted(rel for _, rel in auto.files) == sorted(
        [".gitignore", f"{module}.py", "pkg/helpers.py", "tiny.yml"]
    )
    only = _plan(repo, module, "launcher.snapshot=imports")
    assert only is not None and [rel for _, rel in only.files] == [f"{module}.py"]
    copied = snapshot.copy(auto, tmp_path / "code")
    (path,) = copied["paths"]
    assert (Path(path) / f"{module}.py").read_text() == SNAPMOD.format(version=1)
    assert copied["files"] == 4 and not (Path(path) / ".git").exists()
    with pytest.raises(UserError, match="over launcher.snapshot_max_mb=0.0001"):
        _plan(repo, module, "launcher.snapshot_max_mb=0.0001")
    (repo / ".git").rename(repo / "was_git")  # no repository now
    assert _plan(repo, module).mode == "imports"  # type: ignore[union-attr]
    with pytest.raises(UserError, match="is in no git repository"):
        _plan(repo, module, "launcher.snapshot=git")
