"""Rank 0's writers on a full disk: each failed write is one RunError naming the file (never
logging's "--- Logging error ---" and a traceback), in-process against /dev/full and a full
tmpfs."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import conftest
import pytest

from expctl.errors import RunError
from expctl.rank.report import Reporter, setup_logging

FULL = Path("/dev/full")  # every write fails with ENOSPC


@pytest.fixture
def full_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs with no space left."""
    with conftest.tmpfs(tmp_path / "disk", 64, fill=True) as disk:
        yield disk


def test_train_log_on_a_full_disk_is_one_run_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.log").symlink_to(FULL)
    setup_logging(tmp_path, True)
    try:
        with pytest.raises(
            RunError, match=r"could not write .*train\.log \(No space left on device\)"
        ):
            logging.getLogger("expctl").info("a line")
        logging.getLogger("expctl").info("the file is written no more")  # no second error
    finally:
        setup_logging(None, True)
    assert "Logging error" not in capsys.readouterr().err


def test_metrics_jsonl_on_a_full_disk_is_one_run_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").symlink_to(FULL)
    rep = Reporter(tmp_path, True, max_steps=8)
    with pytest.raises(
        RunError, match=r"could not write .*metrics\.jsonl \(No space left on device\)"
    ):
        rep.record(1, 0, {"train/loss": 1.0}, "train")
    rep.close()  # quietly: the error is already on its way


def test_result_json_on_a_full_disk_is_one_run_error_and_leaves_no_temporary(
    full_tmpfs: Path,
) -> None:
    rep = Reporter(full_tmpfs, False, max_steps=8)
    rep.enabled = True  # write result.json only (metrics.jsonl would not open on a full disk)
    with pytest.raises(
        RunError, match=r"could not write .*result\.json \(No space left on device\)"
    ):
        rep.result({"step": 8, "val/acc": 0.5})
    assert sorted(p.name for p in full_tmpfs.iterdir()) == ["filler"]


def test_the_console_writes_to_stdout_as_it_is_now_not_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A finished run leaves its console handler: a later line (the next run's composition, in a
    notebook or a test) goes to the stdout of that moment, never to a closed one."""
    import io

    first = io.StringIO()
    monkeypatch.setattr(sys, "stdout", first)
    setup_logging(None, True)
    logging.getLogger("expctl").info("one")
    first.close()
    second, errors = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", second)
    monkeypatch.setattr(sys, "stderr", errors)
    logging.getLogger("expctl").info("two")
    assert second.getvalue() == "two\n" and errors.getvalue() == ""
