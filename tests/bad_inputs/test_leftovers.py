"""Refusals leave nothing behind, at any depth: not a lock file in a folder that is not a run, not
a runs/ root, not a run directory a user error stopped mid-run; and a -C file or a frozen
config.yaml that holds nothing is refused, never read as the built-in defaults."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import conftest
import pytest

from expctl import cli

RUN = ["run", *conftest.SMALL, "train.device=cpu", "sched=none", "train.max_steps=1"]


def tree(root: Path) -> dict[str, str]:
    """Every path under `root` (hidden ones included), with each file's digest."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        for p in sorted(root.rglob("*"))
    }


def refused(args: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert expected in err and "Traceback" not in err, err
    assert len(lines) == 2 and lines[0].startswith("expctl: error: "), err
    assert lines[1].startswith("  HINT: "), err
    return err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([*RUN, "run.dir=."], "is not empty and holds no config.yaml"),
        ([*RUN, "run.dir=mydata"], "is not empty and holds no config.yaml"),
        ([*RUN, "run.dir=mydata/deeper/new", "run.root=x"], "is not empty and holds no"),
        ([*RUN, "run.name=" + "a" * 300], "shorten run.name"),
        ([*RUN, "run.name=" + "a" * 300, "run.root=new/runs"], "shorten run.name"),
        (["run", "-C", "empty.yml"], "-C empty.yml: the file is empty"),
        (["show", "-C", "comments.yml"], "-C comments.yml: the file is empty"),
        (["show", "-C", "null.yml"], "-C null.yml: the file is empty"),
        (["show", "-C", "r/config.yaml"], "the file is empty"),
        (["eval", "r"], "r/config.yaml: the file is empty"),
        ([*RUN, "run.dir=sw/trial_001"], "would put a run in the directory of sweep"),
        ([*RUN, "run.root=sw"], "would put a run in the directory of sweep"),
        ([*RUN, "run.dir=sw/trial_000/mine"], "would put a run in the directory of sweep"),
        ([*RUN, "run.dir=sw/mine"], "would put a run in the directory of sweep"),
        ([*RUN, "run.dir=sw"], "/sw is the directory of a sweep"),
    ],
    ids=[
        "dot",
        "data",
        "deeper",
        "long-name",
        "long-name-new-root",
        "empty",
        "comments",
        "null",
        "empty-frozen",
        "eval-empty-frozen",
        "sweep-trial-not-started",
        "sweep-as-root",
        "inside-a-trial",
        "beside-the-trials",
        "the-sweep-itself",
    ],
)
def test_a_refusal_leaves_nothing_at_any_depth(
    args: list[str],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mydata").mkdir()
    (tmp_path / "mydata" / "table.csv").write_text("a,b\n1,2\n")
    (tmp_path / "mydata" / "deeper").mkdir()
    (tmp_path / "mydata" / "deeper" / "new").mkdir()
    (tmp_path / "mydata" / "deeper" / "new" / "keep.txt").write_text("mine\n")
    (tmp_path / "empty.yml").write_text("")
    (tmp_path / "comments.yml").write_text("# train: {max_epochs: 2}\n\n")
    (tmp_path / "null.yml").write_text("---\n~\n")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("")
    (tmp_path / "sw" / "trial_000").mkdir(parents=True)  # a sweep whose trial 1 has not started
    (tmp_path / "sw" / "sweep.json").write_text("{}\n")
    (tmp_path / "sw" / "journal.log").write_text("")
    (tmp_path / "sw" / "trial_000" / "trial.json").write_text('{"sweep_dir": "sw", "number": 0}\n')
    before = tree(tmp_path)
    refused(args, expected, capsys)
    assert tree(tmp_path) == before, "nothing half-written, at any depth"


def test_run_dir_slash_is_refused_without_a_lock_file_at_the_root(
    capsys: pytest.CaptureFixture[str],
) -> None:
    if os.access("/", os.W_OK) is False:
        pytest.skip("only root can write in /")
    assert not Path("/.lock").exists(), "left by something else: this test cannot tell"
    refused([*RUN, "run.dir=/"], "run.dir / is not empty and holds no config.yaml", capsys)
    assert not Path("/.lock").exists()


@pytest.mark.slow  # trains
def test_a_corrupt_image_met_mid_run_leaves_no_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run trains a few steps (metrics rows, no checkpoint yet) before the batch holding the
    corrupt file: nothing it wrote can be continued, so nothing stays."""
    conftest.image_tree(tmp_path / "images", classes=2, per_class=12)
    (tmp_path / "images" / "class_1" / "zz_broken.png").write_bytes(b"not an image")
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    args = [
        "run",
        "model=mlp",
        "data=image_folder",
        "data.root=images",
        "data.val=null",
        "data.image_size=8",
        "data.batch_size=2",
        "train.device=cpu",
        "train.log_every=1",
        "train.max_epochs=1",
        "checkpoint.every=0",
    ]
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert "train epoch 1 step 2/" in out, "met mid-run, after rows were logged"
    assert "zz_broken.png cannot be decoded" in err and len(err.strip().splitlines()) == 2, err
    assert tree(tmp_path) == before, "no run directory, no runs/ root"


@pytest.mark.parametrize("planted", ["symlink", "fifo"])
def test_a_lock_file_planted_as_a_symlink_or_a_fifo_is_refused_never_followed(
    planted: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launch would truncate a symlink's target (any file, as root) or wait on a FIFO."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    if planted == "symlink":
        (tmp_path / "r" / ".lock").symlink_to(target)
    else:
        os.mkfifo(tmp_path / "r" / ".lock")
    before = tree(tmp_path)
    refused([*RUN, "run.dir=r"], "cannot write in run directory", capsys)
    assert tree(tmp_path) == before and target.read_text() == "keep me\n"
