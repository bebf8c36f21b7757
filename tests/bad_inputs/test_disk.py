"""A run or a sweep whose run.root cannot be written (a read-only filesystem: as root, file modes
do not stop us, a read-only mount does): one or two lines, exit 2, no traceback."""

from __future__ import annotations

import contextlib
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


def _fill(disk: Path, name: str = "filler") -> None:
    with contextlib.suppress(OSError), open(disk / name, "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()


@pytest.mark.slow  # trains a two-trial sweep
def test_sweep_best_on_a_full_disk_is_one_line_and_leaves_no_partial_best_yml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """best.yml is written whole or not at all: a full disk keeps the previous one as it was,
    and leaves no empty one (which `-C best.yml` would read as the built-in defaults)."""
    monkeypatch.chdir(tmp_path)
    with conftest.tmpfs(tmp_path / "disk", 4096) as disk:
        sweep_args = ["run", "-m", *conftest.SMALL, "train.max_steps=1", "optim.lr=0.1,0.2"]
        assert cli.main([*sweep_args, f"run.root={disk}"]) == 0
        (sweep,) = disk.glob("sweep-*")
        assert cli.main(["sweep", "best", str(sweep)]) == 0
        best = sweep / "best.yml"
        kept = best.read_bytes()
        _fill(disk)
        capsys.readouterr()
        for previous in (True, False):
            if not previous:
                best.unlink()
                _fill(disk, "filler2")  # the space best.yml held
            assert cli.main(["sweep", "best", str(sweep)]) == 1
            err = capsys.readouterr().err
            assert err == (
                f"expctl: error: could not write {best} (No space left on device): free space in "
                f"{sweep}, then run `expctl sweep best {sweep}` again\n"
            )
            assert best.read_bytes() == kept if previous else not best.exists()
            assert not list(sweep.glob(".*tmp*")), "no temporary file left"
        assert cli.main(["sweep", "plot", str(sweep)]) == 1  # was a traceback from PIL
        plot = sweep / "plot_intermediate_values.png"
        assert capsys.readouterr().err == (
            f"expctl: error: could not write {plot} (No space left on device): free space in "
            f"{sweep}, then run `expctl sweep plot {sweep}` again\n"
        )
        assert not list(sweep.glob("plot_*")) and not list(sweep.glob(".*tmp*"))


@pytest.mark.parametrize("where", [".", "metrics.jsonl", "tb/events.out", "eval/val.json"])
def test_a_failed_write_names_the_run_directory_to_resume(where: str, tmp_path: Path) -> None:
    """Whatever file (or the folder itself) a full disk stopped, the hint names the run."""
    from expctl.rank.report import write_failed

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("train: {}\n")
    error = write_failed(run / where, OSError(28, "No space left on device"))
    assert str(error).endswith(f"run the same command with run.dir={run} to resume")
