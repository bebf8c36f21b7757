"""Sweeps: grid / TPE over Hydra's multirun syntax, ASHA across trials, the ledger and its
commands, failures, resume, and the same on Slurm."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli_env
from conftest import expctl as run_cli

from expctl import ledger


def sweep_dir_of(stdout: str) -> Path:
    return Path(re.search(r"sweep directory (\S+)", stdout).group(1))  # type: ignore[union-attr]


def test_grid_sweep_runs_each_point_and_writes_the_ledger(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.01,0.3",
        "model.hidden=[8],[32,32]",
        "train.max_epochs=1",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = ledger.rows(sweep)
    assert len(rows) == 4 and all(r.status == "completed" for r in rows)
    assert {r.overrides for r in rows} == {
        f"optim.lr={a} model.hidden={b}" for a in ("0.01", "0.3") for b in ("[8]", "[32,32]")
    }
    for r in rows:
        result = json.loads((Path(r.run_dir) / "result.json").read_text())
        assert r.value == result["val/acc"]
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    values = [float(x) for x in re.findall(r"completed\s+([0-9.]+)", table)]
    assert len(values) == 4 and values == sorted(values, reverse=True), "sorted best first"
    best = run_cli("sweep", "best", str(sweep), cwd=tiny.parent).stdout
    top = float(re.search(r"best trial \d+: ([0-9.]+)", best).group(1))  # type: ignore[union-attr]
    assert top == pytest.approx(max(values), abs=1e-3) and (sweep / "best.yml").is_file()
    shown = run_cli("show", "-C", str(sweep / "best.yml"), cwd=tiny.parent).stdout
    assert "dir: null" in shown, "best.yml is a reusable config"


def test_asha_stops_bad_trials_and_keeps_good_ones(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.3,0.0001,0.00001,0.2",
        "train.max_epochs=4",
        "sweep.pruner=asha",
        "sweep.reduction=2",
        cwd=tiny.parent,
    )
    rows = {r.overrides: r for r in ledger.rows(sweep_dir_of(proc.stdout))}
    stopped = [r for r in rows.values() if r.status == "stopped"]
    assert stopped and all(r.epoch is not None and r.epoch < 4 for r in stopped)
    assert rows["optim.lr=0.3"].status == "completed" and rows["optim.lr=0.3"].epoch == 4
    assert rows["optim.lr=1e-05"].status == "stopped"
    for r in stopped:
        assert json.loads((Path(r.run_dir) / "result.json").read_text())["status"] == "stopped"


def test_tpe_samples_log_interval_and_choices(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "sweep=tpe",
        "sweep.n_trials=4",
        "train.max_epochs=1",
        "optim.lr=tag(log, interval(0.001, 0.5))",
        "model.hidden=choice([8],[16])",
        cwd=tiny.parent,
    )
    rows = ledger.rows(sweep_dir_of(proc.stdout))
    assert len(rows) == 4 and all(r.status == "completed" for r in rows)
    assert len({r.params["optim.lr"] for r in rows}) == 4, "every trial samples a new point"
    for r in rows:
        lr = r.params["optim.lr"]
        assert 0.001 <= lr <= 0.5
        frozen = (Path(r.run_dir) / "config.yaml").read_text()
        assert f"lr: {lr}" in frozen and r.params["model.hidden"] in ("[8]", "[16]")


def test_ddp_trials_are_pruned_on_every_rank(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.3,0.00001",
        "train.max_epochs=3",
        "launcher=local",
        "launcher.nproc=2",
        "sweep.pruner=asha",
        "sweep.reduction=2",
        cwd=tiny.parent,
    )
    rows = {r.overrides: r for r in ledger.rows(sweep_dir_of(proc.stdout))}
    assert rows["optim.lr=0.3"].status == "completed"
    bad = rows["optim.lr=1e-05"]
    assert bad.status == "stopped" and bad.epoch == 1
    assert "2 rank(s)" in (Path(bad.run_dir) / "train.log").read_text()


def test_failing_trial_is_recorded_and_the_sweep_goes_on(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "data.batch_size=100000,16",
        "train.max_epochs=1",
        cwd=tiny.parent,
    )
    rows = {r.overrides: r for r in ledger.rows(sweep_dir_of(proc.stdout))}
    assert rows["data.batch_size=100000"].status == "failed"
    assert "larger than the 512 training samples" in rows["data.batch_size=100000"].error
    assert rows["data.batch_size=16"].status == "completed"
    assert (
        "larger than"
        in run_cli("sweep", "table", str(sweep_dir_of(proc.stdout)), cwd=tiny.parent).stdout
    )
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "data.batch_size=100000,16",
        "sweep.stop_on_failure=true",
        cwd=tiny.parent,
    )
    assert [r.status for r in ledger.rows(sweep_dir_of(proc.stdout))] == ["failed"]


def test_repeat_runs_each_configuration_with_seeds(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "--repeat",
        "2",
        "optim.lr=0.05,0.3",
        "train.max_epochs=1",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = ledger.rows(sweep)
    assert len(rows) == 4
    from expctl import config

    seeds = sorted(config.load(r.run_dir).train.seed for r in rows)
    assert seeds == [0, 0, 1, 1], "each configuration once with seed 0, once with seed 1"
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    assert "± std" in table and table.count("optim.lr=") == 2


def test_resume_reruns_a_lost_trial_and_the_rest(tiny: Path) -> None:
    args = [
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.1,0.2,0.3",
        "imports=[faulty]",
        "train.step=kill_at_step",
        "checkpoint.every=5",
    ]
    killed = run_cli(*args, cwd=tiny.parent, env=cli_env(KILL_AT_STEP="40"), check=False)
    assert killed.returncode == -9
    sweep = sweep_dir_of(killed.stdout)
    statuses = [r.status for r in ledger.rows(sweep)]
    assert statuses == ["completed", "lost"], statuses  # trial 1 died with the driver at step 8
    run_cli("sweep", "resume", str(sweep), cwd=tiny.parent)
    rows = ledger.rows(sweep)
    assert [r.status for r in rows] == ["completed"] * 3 and len({r.run_dir for r in rows}) == 3
    resumed = next(r for r in rows if r.run_dir.endswith("trial_001"))
    assert "resumed from" in (Path(resumed.run_dir) / "train.log").read_text()


def test_two_sweeps_started_together_never_collide(tiny: Path) -> None:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "expctl",
                "run",
                "-C",
                str(tiny),
                "-m",
                "optim.lr=0.1,0.2",
                "train.max_epochs=1",
            ],
            cwd=tiny.parent,
            env=cli_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    dirs = {sweep_dir_of(o) for o in outs}
    assert len(dirs) == 2 and all(len(ledger.rows(d)) == 2 for d in dirs)


def test_bad_sweep_inputs_are_user_errors(tiny: Path) -> None:
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=interval(0.1,1)", cwd=tiny.parent, check=False
    )
    assert proc.returncode == 2 and "needs a sampler" in proc.stderr
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "sweep=tpe",
        "sweep.n_trials=2",
        "model=resnet19,cnn",
        cwd=tiny.parent,
        check=False,
    )
    assert proc.returncode == 2 and "Did you mean 'resnet18'" in proc.stderr
    assert not (tiny.parent / "runs").exists()


def test_seed_004_study_at_small_scale(tmp_path: Path) -> None:
    proc = run_cli(
        "run",
        "-m",
        "experiment=fashion_tune",
        "sweep.n_trials=3",
        "train.max_epochs=2",
        "data.subset=2000",
        "data.val_split=1000",
        cwd=tmp_path,
    )
    rows = ledger.rows(sweep_dir_of(proc.stdout))
    assert len(rows) == 3 and all(r.status in ("completed", "stopped") for r in rows)
    assert re.search(r"best trial \d+: val/acc=[0-9.]+\s+test/acc=[0-9.]+", proc.stdout)


def test_median_rule_and_the_plot(tiny: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.3,0.2,0.00001",
        "train.max_epochs=3",
        "sweep.pruner=median",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = {r.overrides: r for r in ledger.rows(sweep)}
    assert rows["optim.lr=1e-05"].status == "stopped" and rows["optim.lr=0.3"].status == "completed"
    out = run_cli("sweep", "plot", str(sweep), cwd=tiny.parent).stdout
    png = sweep / "sweep.png"
    assert (
        str(png) in out
        and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and png.stat().st_size > 10_000
    )
