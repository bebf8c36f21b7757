"""A run or a sweep whose run.root cannot be written (a read-only filesystem: as root, file modes
do not stop us, a read-only mount does): one or two lines, exit 2, no traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import conftest
import pytest

from expctl import cli

SMALL = ["data=synthetic", "data.num_samples=32", "data.val_samples=16", "train.max_steps=1"]


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    with conftest.tmpfs(tmp_path / "ro", 64, read_only=True) as disk:
        yield disk


@pytest.fixture
def full(tmp_path: Path) -> Iterator[Path]:
    with conftest.tmpfs(tmp_path / "full", 64, fill=True) as disk:
        yield disk


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", *SMALL, "run.dir=FULL/d"], "cannot write in run directory"),
        (["run", *SMALL], "cannot write in run directory"),
        (["run", "-m", *SMALL, "optim.lr=0.1,0.2"], "cannot write the sweep's files"),
    ],
)
def test_a_full_run_root_is_a_short_error_and_leaves_nothing(
    args: list[str],
    expected: str,
    full: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [a.replace("FULL", str(full)) for a in args]
    assert cli.main([*args, f"run.root={full / 'runs'}"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert expected in err and "No space left on device" in err, err
    assert len(lines) == 2 and lines[1].startswith("  HINT: ") and "Traceback" not in err
    assert sorted(p.name for p in full.iterdir()) == ["filler"], "nothing half-made"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", *SMALL], "cannot create run directory"),
        (["run", *SMALL, "run.dir=RO/exact"], "cannot create run directory"),
        (["run", "-m", *SMALL, "optim.lr=0.1,0.2"], "cannot create a sweep directory"),
    ],
)
def test_a_read_only_run_root_is_a_short_error(
    args: list[str],
    expected: str,
    read_only: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [a.replace("RO", str(read_only)) for a in args]
    assert cli.main([*args, f"run.root={read_only / 'runs'}"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert expected in err and "Read-only file system" in err, err
    assert len(lines) == 2 and lines[1].startswith("  HINT: ") and "Traceback" not in err
