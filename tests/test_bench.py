"""The benchmark harness runs end to end (smoke mode: short runs; timings are not asserted)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SMALL, cli_env

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow


def _bench(script: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run bench/SCRIPT ARGS as a user would; fail with its stderr when it fails."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=600,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_harness_smoke_prints_a_table_with_ratios(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    proc = _bench("harness.py", "--suite", "cpu", "--smoke", "--only", "mlp", "--gpus", "1",
                  "--out", str(out))  # fmt: skip
    assert "| mlp | 1 |" in proc.stdout and "expctl / raw-tensor" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    assert set(row["median"]) == {"expctl", "raw-tensor", "raw-loader"}
    assert all(v > 0 for v in row["median"].values()) and not row["errors"]


def test_gpu_suite_smoke_runs_every_workload_on_the_cpu(tmp_path: Path) -> None:
    """The GPU suite's code paths (the CIFAR-stem model imported by expctl as a user module,
    2 workers, the FLOP column) on CPU-sized stand-ins."""
    out = tmp_path / "g.json"
    proc = _bench("harness.py", "--suite", "gpu", "--smoke", "--gpus", "2", "--only", "cifar",
                  "--out", str(out))  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["gpus"] for r in rows] == [2] and not any(r["errors"] for r in rows)
    assert rows[0]["flops_per_sample"] > 0
    assert "| cifar: resnet18 3x3 stem 32 | 2 |" in proc.stdout
    for label in ("expctl", "raw-tensor"):  # each run's wall split: start, steps, end
        ((start, end),) = rows[0]["phases"][label]
        (wall,) = rows[0]["walls"][label]
        assert 0 < start < wall and 0 < end < wall and start + end < wall, (label, start, end)


def test_gpu_images_smoke_runs_every_contender_on_the_cpu(tmp_path: Path) -> None:
    """bench/gpu_images.py (issue 25) end to end on tiny JPEGs: the CPU contenders train, the
    GPU decoders refuse the CPU in expctl's one line (their overrides are valid), the table and
    the JSON are written."""
    out = tmp_path / "g.json"
    proc = _bench("gpu_images.py", "--smoke", "--root", str(tmp_path / "jpegs"), "--out", str(out))
    rows = {r["contender"]: r for r in json.loads(out.read_text())["train"]}
    assert set(rows) == {"synthetic", "pillow", "nvjpeg", "nvimgcodec", "auto", "torchvision"}
    for name in ("synthetic", "pillow", "auto", "torchvision"):
        assert rows[name]["img_s"] > 0 and rows[name]["cpu_s_per_img"] > 0, rows[name]
    assert "check gpu train: labels and layout True" in proc.stdout
    assert "check gpu val: labels and layout True" in proc.stdout
    assert "data.decode=auto: no CUDA device" in rows["auto"]["how"]
    assert "data.decode=gpu needs a CUDA device" in rows["nvjpeg"]["how"]
    assert "data.decode=nvimgcodec" in rows["nvimgcodec"]["how"]
    assert re.search(r"\| 1 \| \d+ \| pillow \| [\d,]+ \| [\d.]+ \|", proc.stdout), proc.stdout
    val = {v["contender"]: v for v in json.loads(out.read_text())["validation"]}
    assert val["pillow"]["images"] == val["auto"]["images"] == 8


def test_latency_smoke_prints_a_table(tmp_path: Path) -> None:
    out = tmp_path / "l.json"
    proc = _bench(
        "latency.py", "--repeats", "1", "--only", "status", "--out", str(out), cwd=tmp_path
    )
    assert "| expctl status RUN | after | 1 |" in proc.stdout, proc.stdout
    (row,) = [r for r in json.loads(out.read_text()) if r["command"] == "expctl status RUN"]
    assert row["torch"] == 0 and row["min_s"] > 0


def test_harness_deadline_starts_no_row_after_it_and_lists_them(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    proc = _bench("harness.py", "--suite", "cpu", "--smoke", "--deadline", "0", "--out", str(out))
    got = json.loads(out.read_text())
    assert got["rows"] == [] and got["not_run"] == ["mlp x1", "mlp x2", "cnn x1", "cnn x2"]
    assert "Not run (--deadline 0 s reached): mlp x1, mlp x2, cnn x1, cnn x2" in proc.stdout


def test_timestamps_prefixes_each_line_and_passes_the_exit_code_on() -> None:
    cmd = [sys.executable, str(REPO / "bench" / "timestamps.py"), sys.executable, "-c",
           "import sys; print('a'); print('b', file=sys.stderr); sys.exit(3)"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 3 and len(lines) == 3, proc.stdout
    assert [x.split()[1:] for x in lines] == [["a"], ["b"], ["exit", "3"]]
    assert all(float(x.split()[0]) >= 0 for x in lines)
    killed = [sys.executable, str(REPO / "bench" / "timestamps.py"), "bash", "-c", "kill -9 $$"]
    assert subprocess.run(killed, capture_output=True, timeout=60).returncode == 128 + 9
    binary = [sys.executable, str(REPO / "bench" / "timestamps.py"), "printf", "\\377\\n"]
    proc = subprocess.run(binary, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "\ufffd" in proc.stdout
    missing = [sys.executable, str(REPO / "bench" / "timestamps.py"), "no-such-command-x"]
    proc = subprocess.run(missing, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 127 and "cannot run 'no-such-command-x'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_startup_ab_without_two_trees_says_how_to_use_it() -> None:
    proc = subprocess.run(
        ["bash", str(REPO / "bench" / "startup_ab.sh"), "."], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "usage: bash bench/startup_ab.sh TREE_A TREE_B" in proc.stderr


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("harness.py", ["--gpus", "0"], "--gpus 0: counts are 1 or more"),
        ("harness.py", ["--gpus", "abc"], "--gpus abc: a comma-separated list"),
        ("harness.py", ["--deadline", "-5"], "--deadline -5: seconds, 0 or more"),
        ("harness.py", ["--repeats", "0"], "--repeats 0: 1 or more"),
        ("raw_ddp.py", ["--steps", "5", "--warmup", "10"], "--warmup 10 must be >= 0 and below"),
        ("raw_ddp.py", ["--steps", "20", "--warmup", "5", "--profile", "50"], "at most the 15"),
        ("raw_ddp.py", ["--batch", "512", "--samples", "100"], "--batch 512: 1 to the 100"),
    ],
)
def test_bench_scripts_refuse_bad_arguments_in_one_line(
    script: str, args: list[str], says: str
) -> None:
    """(raw_ddp.py once looped forever on a batch larger than its data, and crashed at exit
    when --profile outlasted the run; the harness measured 0 workers as 0 samples/s.)"""
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--suite", "cpu", "--smoke", *args]
        if script == "harness.py"
        else [sys.executable, str(REPO / "bench" / script), "--model", "mlp", *args],
        capture_output=True, text=True, env=cli_env(), timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_step_profile_prints_a_profile_of_its_window(tmp_path: Path) -> None:
    """bench/step_profile.py as a user module: `train.step=profiled` trains as `supervised` and
    prints torch.profiler's table and the window's time per step (steps 2-4 here)."""
    env = cli_env(PROFILE_FROM="2", PROFILE_STEPS="2")
    env["PYTHONPATH"] = f"{REPO / 'bench'}:{env.get('PYTHONPATH', '')}"
    proc = subprocess.run(
        [sys.executable, "-m", "expctl", "run", *SMALL, "imports=[step_profile]",
         "train.step=profiled", "train.max_steps=6", "train.max_epochs=3",
         f"run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Self CPU time total" in proc.stderr
    assert "profiled window:" in proc.stderr and "ms a step" in proc.stderr
    assert json.loads((tmp_path / "run" / "result.json").read_text())["step"] == 6
