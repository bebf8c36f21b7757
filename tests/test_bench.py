"""The benchmark harness runs end to end (smoke mode: short runs; timings are not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, cli_env

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow


def test_harness_smoke_prints_a_table_with_ratios(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "harness.py"),
            "--suite",
            "cpu",
            "--smoke",
            "--only",
            "mlp 1w",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| cpu mlp 1w |" in proc.stdout and "expctl / raw" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert row["expctl"] > 0 and row["raw"] > 0 and row["raw-tensor"] > 0


def test_latency_smoke_prints_a_table(tmp_path: Path) -> None:
    out = tmp_path / "l.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "latency.py"),
            *("--repeats", "1", "--only", "status", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| expctl status RUN | after | 1 |" in proc.stdout, proc.stdout
    (row,) = [r for r in json.loads(out.read_text()) if r["command"] == "expctl status RUN"]
    assert row["torch"] == 0 and row["min_s"] > 0
