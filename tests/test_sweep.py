"""Sweeps: grid / TPE over Hydra's multirun syntax, ASHA across trials, the ledger and its
commands, failures, resume, and the same on Slurm."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import SMALL, TINY, cli_env
from conftest import expctl as run_cli

from expctl import cli
from expctl.config import frozen as config
from expctl.sweep import aggregate, ledger
from expctl.sweep.best import best

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow


def sweep_dir_of(stdout: str) -> Path:
    return Path(re.search(r"sweep directory (\S+)", stdout).group(1))  # type: ignore[union-attr]


def test_grid_sweep_runs_each_point_and_writes_the_ledger(tiny: Path) -> None:
    tiny.write_text(TINY + "sweep: {params: {optim.lr: '0.9'}}\n")  # the command line wins
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
    assert sweep.name.startswith("sweep-"), "run.name left at its default: no prefix"
    rows = ledger.rows(sweep)
    assert len(rows) == 4 and all(r.status == "completed" for r in rows)
    assert {r.overrides for r in rows} == {
        f"optim.lr={a} model.hidden={b}" for a in ("0.01", "0.3") for b in ("[8]", "[32,32]")
    }
    for r in rows:
        result = json.loads((Path(r.run_dir) / "result.json").read_text())
        assert r.value == result["val/acc"]
        assert f"optim.lr={config.load(r.run_dir).optim.args['lr']} " in r.overrides
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    values = [float(x) for x in re.findall(r"completed\s+([0-9.]+)", table)]
    assert len(values) == 4 and values == sorted(values, reverse=True), "sorted best first"
    best = run_cli("sweep", "best", str(sweep), cwd=tiny.parent).stdout
    top = float(re.search(r"best trial \d+: val/acc=([0-9.]+)  \(optim", best).group(1))  # type: ignore[union-attr]
    assert top == pytest.approx(max(values), abs=1e-3) and (sweep / "best.yml").is_file()
    shown = run_cli("show", "-C", str(sweep / "best.yml"), cwd=tiny.parent).stdout
    assert "dir: null" in shown, "best.yml is a reusable config"


def test_a_sweep_over_components_trains_what_its_table_says(tiny: Path) -> None:
    """The file says `optim: {name: sgd, lr: 0.1, momentum: 0.9}`: each trial trains the
    optimizer its label names, from that optimizer's own defaults."""
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "optim=adam,adamw", "train.max_steps=4", cwd=tiny.parent
    )
    assert "optim=adamw sets aside optim 'sgd'" in proc.stderr
    rows = ledger.rows(sweep_dir_of(proc.stdout))
    assert sorted(r.overrides for r in rows) == ["optim=adam", "optim=adamw"]
    for r in rows:
        frozen = (Path(r.run_dir) / "config.yaml").read_text()
        name = r.overrides.split("=")[1]
        assert f"optim:\n  name: {name}\n  lr: 0.001\n" in frozen and "momentum" not in frozen
    by_name = run_cli(
        "run", "-C", str(tiny), "-m", "optim.name=rmsprop", "train.max_steps=4", cwd=tiny.parent
    )
    (row,) = ledger.rows(sweep_dir_of(by_name.stdout))
    assert "name: rmsprop" in (Path(row.run_dir) / "config.yaml").read_text()


def test_asha_stops_bad_trials_and_keeps_good_ones(tiny: Path) -> None:
    """Two trials at once, each judged when it reports (asynchronous ASHA): which reaches a rung
    first is the machine's doing, so this checks what holds in every order. lr=0.2 is the best
    at every rung: never stopped. lr=1e-5 is the worst at the first and starts once an earlier
    trial ended (so reported there): stopped at epoch 1. lr=1e-4 and lr=0.05 go on or stop by
    the order (a trial alone at a rung goes on); none is stopped at its last epoch."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.2,0.0001,0.00001,0.05",
        "train.max_epochs=4",
        "sweep.pruner=asha",
        "sweep.reduction=2",
        "sweep.max_concurrent=2",
        cwd=tiny.parent,
    )
    rows = {r.overrides: r for r in ledger.rows(sweep_dir_of(proc.stdout))}
    _ended_within_budget(rows, 4)
    assert rows["optim.lr=0.2"].status == "completed"
    assert (rows["optim.lr=1e-05"].status, rows["optim.lr=1e-05"].epoch) == ("stopped", 1)


def _ended_within_budget(rows: dict[str, ledger.Row], epochs: int) -> None:
    """Each trial completed its `epochs`, or was stopped before its last (result.json agrees)."""
    seen = {o: (r.status, r.epoch, r.optuna_trial, Path(r.run_dir).name) for o, r in rows.items()}
    for r in rows.values():
        assert (r.status, r.epoch) == ("completed", epochs) or (
            r.status == "stopped" and r.epoch is not None and r.epoch < epochs
        ), seen
        assert json.loads((Path(r.run_dir) / "result.json").read_text())["status"] == r.status
        assert r.optuna_trial == r.number, seen  # no retries here: one attempt per trial


@pytest.mark.parametrize("pruner", ["asha", "median"])
def test_a_trial_judged_at_its_last_epoch_completed_it(tiny: Path, pruner: str) -> None:
    """The pruner first judges at epoch 2 (sweep.grace=2), the last: lr=1e-5, there after the
    better lr=0.2, trained its whole budget, so it completed (its final checkpoint saved, its
    value the sweep's), not stopped. With two trials at once the same came from their order:
    ASHA stopped a good trial at its last epoch behind a better one."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.2,0.00001",
        "train.max_epochs=2",
        f"sweep.pruner={pruner}",
        "sweep.grace=2",
        "sweep.reduction=2",
        "sweep.max_concurrent=1",  # in this order
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = ledger.rows(sweep)
    assert [(r.status, r.epoch, r.step) for r in rows] == [("completed", 2, 32)] * 2, rows
    late = Path(rows[1].run_dir)
    assert rows[1].value == json.loads((late / "result.json").read_text())["val/acc"]
    assert (late / "checkpoints" / "step_000000032.pt").is_file()
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    assert re.search(r"^\s+1\s+completed\s+\S+\s+\S+\s+2\s+32\s", table, re.M), table


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
        assert f"lr: {lr}" in frozen and r.params["model.hidden"] in ([8], [16])


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
    """The other trials still run, and the sweep exits 1 (as Hydra's multirun does), naming how
    many failed; so does a resume that cannot mend them, and a sweep stopped at the failure."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "data.batch_size=100000,16",
        "train.max_epochs=1",
        cwd=tiny.parent,
        check=False,
    )
    sweep = sweep_dir_of(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    assert f"1 of 2 trial(s) failed: see `expctl sweep table {sweep}`" in proc.stderr
    rows = {r.overrides: r for r in ledger.rows(sweep)}
    assert rows["data.batch_size=100000"].status == "failed"
    assert "larger than the 512 training samples" in rows["data.batch_size=100000"].error
    assert rows["data.batch_size=16"].status == "completed"
    assert "larger than" in run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    resumed = run_cli("sweep", "resume", str(sweep), cwd=tiny.parent, check=False)
    assert resumed.returncode == 1 and "1 of 2 trial(s) failed" in resumed.stderr
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "data.batch_size=100000,16",
        "sweep.stop_on_failure=true",
        "sweep.max_concurrent=1",
        cwd=tiny.parent,
        check=False,
    )
    stopped = sweep_dir_of(proc.stdout)
    assert [r.status for r in ledger.rows(stopped)] == ["failed", "pending"]
    assert proc.returncode == 1 and "1 of 2 trial(s) failed" in proc.stderr
    assert f"`expctl sweep resume --skip-failed {stopped}` runs the others" in proc.stdout
    # resumed, the failure stops it again; --skip-failed leaves it and runs the rest
    again = run_cli("sweep", "resume", str(stopped), cwd=tiny.parent, check=False)
    assert [r.status for r in ledger.rows(stopped)] == ["failed", "pending"], again.stdout
    # a run put by hand where trial 1 goes (expctl run refuses a run.dir in a sweep): named
    mine = tiny.parent / "mine"
    run_cli("run", "-C", str(tiny), "optim.lr=0.5", f"run.dir={mine}", cwd=tiny.parent)
    shutil.copytree(mine, stopped / "trial_001")
    foreign = run_cli(
        "sweep", "resume", "--skip-failed", str(stopped), cwd=tiny.parent, check=False
    )
    assert foreign.returncode == 2, foreign.stderr
    assert "trial 1's folder holds a run the sweep did not start" in foreign.stderr
    assert "(the sweep stopped)" in foreign.stderr and "Traceback" not in foreign.stderr
    row = ledger.rows(stopped)[1]
    assert row.foreign and row.value is None and row.best is None, row
    shutil.rmtree(stopped / "trial_001")
    skipped = run_cli(
        "sweep", "resume", "--skip-failed", str(stopped), cwd=tiny.parent, check=False
    )
    assert skipped.returncode == 1 and "resuming 1 trial(s)" in skipped.stdout, skipped.stdout
    assert [r.status for r in ledger.rows(stopped)] == ["failed", "completed"]
    done = run_cli("sweep", "resume", "--skip-failed", str(stopped), cwd=tiny.parent, check=False)
    assert "nothing to resume" in done.stdout and done.returncode == 1, done
    # or: the same resume told not to stop at a failure (how trials run may change on resume)
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "data.batch_size=100000,16", "sweep.stop_on_failure=true",
        "sweep.max_concurrent=1", cwd=tiny.parent, check=False,
    )  # fmt: skip
    told = sweep_dir_of(proc.stdout)
    run_cli(
        "sweep", "resume", str(told), "sweep.stop_on_failure=false", cwd=tiny.parent, check=False
    )
    assert [r.status for r in ledger.rows(told)] == ["failed", "completed"]


def test_a_trial_killed_by_a_signal_says_so(tiny: Path) -> None:
    """A trial SIGKILLed mid-run (the kernel's out-of-memory killer, a `kill -9`) printed no
    error: the ledger says which signal ended it, not the last line of its output (the driver's
    header line, `sweep trial (cores 0)`)."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.1",
        "imports=[faulty]",
        "train.step=kill_at_step",
        cwd=tiny.parent,
        env=cli_env(KILL_AT_STEP="3"),
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    (row,) = ledger.rows(sweep_dir_of(proc.stdout))
    assert row.status == "failed" and "killed by SIGKILL" in row.error, row.error
    assert re.search(r"trial 0 failed in [0-9.]+ s: killed by SIGKILL", proc.stdout), proc.stdout


def test_repeat_runs_seeds_and_best_is_the_best_configuration_by_its_mean(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "--repeat",
        "2",
        "optim.lr=0.05,0.3",
        "train.max_epochs=1",
        "train.seed=7",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = ledger.rows(sweep)
    assert len(rows) == 4
    seeds = sorted(config.load(r.run_dir).train.seed for r in rows)
    assert seeds == [7, 7, 8, 8], "each configuration once with the base seed, once with +1"
    table_csv = run_cli("sweep", "table", "--csv", str(sweep), cwd=tiny.parent).stdout
    listed = csv.DictReader(io.StringIO(table_csv))
    assert sorted((row["seed"], row["repeat"]) for row in listed) == [
        ("7", "0"), ("7", "0"), ("8", "1"), ("8", "1"),
    ], "seed: the train.seed it trained with (it was the repeat's index)"  # fmt: skip
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent).stdout
    assert "± std" in table and table.count("optim.lr=") == 2
    for key in ("mean", "-mean", "std", "-std"):  # the columns a user sees, as --sort keys
        shown = run_cli("sweep", "table", f"--sort={key}", str(sweep), cwd=tiny.parent).stdout
        cells = [line.split()[2:4] for line in shown.splitlines() if "optim.lr=" in line]
        column = [float(c[key.endswith("std")]) for c in cells]
        assert column == sorted(column, reverse=key.startswith("-")), (key, shown)
    configs: dict[str, list[ledger.Row]] = {}
    for r in rows:
        configs.setdefault(r.config, []).append(r)
    means = {c: statistics.fmean(r.value or 0.0 for r in g) for c, g in configs.items()}
    top = max(means, key=lambda c: means[c])
    summary = re.search(
        r"best configuration: val/acc=([0-9.]+) ± \S+ over 2 seed\(s\) \(trials (\d+), (\d+)\)",
        proc.stdout,
    )
    assert summary, proc.stdout
    assert float(summary.group(1)) == pytest.approx(means[top], abs=1e-3)
    assert {int(summary.group(2)), int(summary.group(3))} == {r.number for r in configs[top]}

    # one lucky seed (0.9) in `a`, the better mean (0.8) in `b`: best is `b`, at the base seed
    a, b = configs
    values = {(a, 0): 0.5, (a, 1): 0.9, (b, 0): 0.8, (b, 1): 0.8}
    lucky = [
        dataclasses.replace(r, value=values[r.config, int(r.overrides.endswith(" seed#1"))])
        for r in rows
    ]
    monkeypatch.setattr(ledger, "rows", lambda _: lucky)
    found = best(sweep)
    from omegaconf import OmegaConf

    best_yml = OmegaConf.load(sweep / "best.yml")
    assert best_yml.optim.lr == float(json.loads(b)["optim.lr"]) and best_yml.train.seed == 7
    assert found.value == pytest.approx(0.8) and found.std == pytest.approx(0.0)
    assert {r.number for r in found.trials} == {r.number for r in configs[b]}
    numbers = ", ".join(str(r.number) for r in found.trials)
    assert found.describe().startswith(
        f"best configuration: val/acc=0.8 ± 0 over 2 seed(s) (trials {numbers})  "
        f"(optim.lr={json.loads(b)['optim.lr']})"
    )


def test_repeats_of_a_sampled_point_share_its_values_and_a_point_twice_is_no_seed(
    tiny: Path,
) -> None:
    """--repeat with a sampler: each drawn point trains with every seed (the sampler drew
    apart each seed's values, and the table grouped what coincided). A grid point written twice,
    or drawn twice, is the same run again: said before it runs, and never counted as seeds."""
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "--repeat", "2", "sweep.sampler=random",
        "sweep.n_trials=3", "optim.lr=choice(0.01,0.02,0.05,0.1,0.2,0.3)", "train.max_epochs=1",
        cwd=tiny.parent,
    )  # fmt: skip
    rows = ledger.rows(sweep_dir_of(proc.stdout))
    assert [r.seed_idx for r in rows] == [0, 1] * 3
    for first, second in zip(rows[::2], rows[1::2], strict=True):
        assert first.config == second.config, (first.overrides, second.overrides)
        lr = {config.load(r.run_dir).optim.args["lr"] for r in (first, second)}
        assert len(lr) == 1 and {config.load(r.run_dir).train.seed for r in (first, second)} == {
            config.load(first.run_dir).train.seed,
            config.load(first.run_dir).train.seed + 1,
        }
    assert [len(g) for g in aggregate.groups(rows)] == [2, 2, 2]

    twice = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=0.1,0.1,0.3", "train.max_epochs=1",
        cwd=tiny.parent,
    )  # fmt: skip
    assert "note: the grid lists optim.lr=0.1 (2 times): each time is a trial of its own" in (
        twice.stderr
    )
    assert "best trial " in twice.stdout and "over 2 seed" not in twice.stdout, twice.stdout
    table = run_cli("sweep", "table", str(sweep_dir_of(twice.stdout)), cwd=tiny.parent).stdout
    assert "± std" not in table and table.count("optim.lr=0.1\n") == 2, table
    # what repeats its metric bit for bit on the CPU: the cores it trained on (torch's threads)
    best_yml = (sweep_dir_of(twice.stdout) / "best.yml").read_text()
    assert re.search(r"\n# trained on [12] core\(s\): .* \(taskset -c 0(-1)? expctl run", best_yml)
    drawn = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=choice(0.1,0.3)", "sweep.sampler=random",
        "sweep.n_trials=3", "train.max_epochs=1", cwd=tiny.parent,
    )  # fmt: skip
    assert "note: sweep.n_trials=3 is more than the 2 point(s) of the space" in drawn.stderr
    assert "best trial " in drawn.stdout, drawn.stdout
    fewer = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=0.1,0.2,0.3", "sweep.n_trials=1",
        "train.max_epochs=1", cwd=tiny.parent,
    )  # fmt: skip
    assert "note: sweep.n_trials=1 runs the first 1 of the grid's 3 points" in fewer.stderr


def test_resume_beside_a_live_driver_is_refused_and_changes_nothing(tiny: Path) -> None:
    """`sweep resume` while the sweep's driver runs: refused in one line naming the driver
    (it started the running trials again, and a completed one ended `lost`), the journal as
    it was; once the driver is stopped, resume finishes the sweep."""
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2", trial=0)
    journal = (path / "journal.log").read_bytes()
    refused = run_cli("sweep", "resume", str(path), cwd=tiny.parent, check=False)
    assert refused.returncode == 2, refused
    assert f"error: sweep {path} is being run by another driver (pid {driver.pid} on host" in (
        refused.stderr
    )
    assert len(refused.stderr.splitlines()) == 2 and "HINT" in refused.stderr, refused.stderr
    assert (path / "journal.log").read_bytes()[: len(journal)] == journal
    assert [r.status for r in ledger.rows(path)][0] == "running"
    os.kill(driver.pid, signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130, out
    # the interrupted trial by hand, with another budget: the sweep would record it as its own
    trial = path / "trial_000"
    ended = ledger.rows(path)[0].status == "completed"  # before the Ctrl-C, on a slow machine
    hand = run_cli(
        "run", "-C", str(trial / "config.yaml"), f"run.dir={trial}", "train.max_epochs=9",
        cwd=tiny.parent, check=False,
    )  # fmt: skip
    assert hand.returncode == 2 and "holds trial 0 of sweep" in hand.stderr, hand.stderr
    said = "which recorded its end" if ended else "not ended: this run differs from it (train."
    assert said in hand.stderr, hand.stderr
    run_cli("sweep", "resume", str(path), cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    assert [r.status for r in ledger.rows(path)] == ["completed"] * 2


@pytest.fixture(scope="module")
def short_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-sampler sweep named `tune` whose 2 trials end inside their first epoch
    (train.max_steps=6 of 16 steps per epoch): one validation each."""
    cwd = tmp_path_factory.mktemp("short")
    (cwd / "tiny.yml").write_text(TINY)
    proc = run_cli(
        "run",
        "-C",
        "tiny.yml",
        "-m",
        "sweep=random",
        "sweep.n_trials=2",
        "optim.lr=tag(log, interval(0.001, 0.5))",
        "train.max_steps=6",
        "run.name=tune",
        cwd=cwd,
    )
    return sweep_dir_of(proc.stdout)


def test_sweep_directory_carries_the_run_name(short_sweep: Path) -> None:
    assert short_sweep.parent.name == "runs" and short_sweep.name.startswith("tune-sweep-")
    assert re.fullmatch(r"tune-sweep-\d{8}-\d{6}-[0-9a-f]{4}", short_sweep.name), short_sweep.name


def test_table_rounds_sampled_values_and_counts_steps(short_sweep: Path) -> None:
    table = run_cli("sweep", "table", str(short_sweep), cwd=short_sweep.parent).stdout
    assert re.search(r" epoch +steps ", table), table
    rows = ledger.rows(short_sweep)
    for r in rows:
        lr = r.params["optim.lr"]
        assert r.overrides == f"optim.lr={lr}" and len(str(lr)) > 8, "the ledger keeps it exact"
        (line,) = [x for x in table.splitlines() if re.match(rf" *{r.number}  completed ", x)]
        fields = line.split()
        assert fields[4:6] == ["1", "6"], f"ended in epoch 1, at step 6: {line}"
        assert fields[7] == f"optim.lr={lr:.4g}", line
    best(short_sweep)
    exact = re.search(r"\n  lr: (\S+)\n", (short_sweep / "best.yml").read_text())
    assert exact and exact.group(1) in {str(r.params["optim.lr"]) for r in rows}


def test_table_as_json_and_csv_sorted_and_filtered(short_sweep: Path) -> None:
    rows = ledger.rows(short_sweep)
    as_json = json.loads(
        run_cli("sweep", "table", "--json", str(short_sweep), cwd=short_sweep).stdout
    )
    assert as_json["metric"] == "val/acc" and as_json["mode"] == "max"
    by_number = {t["trial"]: t for t in as_json["trials"]}
    assert sorted(by_number) == [r.number for r in rows] == [0, 1]
    for r in rows:
        t = by_number[r.number]
        assert t["status"] == "completed" and t["params"] == {"optim.lr": r.params["optim.lr"]}
        assert t["value"] == r.value == t["metrics"]["val/acc"] and t["step"] == 6
        assert Path(t["run_dir"]).name == f"trial_{r.number:03d}"
    text = run_cli("sweep", "table", "--csv", "--sort=-optim.lr", str(short_sweep), cwd=short_sweep)
    table = list(csv.DictReader(io.StringIO(text.stdout)))
    assert [float(x["optim.lr"]) for x in table] == sorted(
        (r.params["optim.lr"] for r in rows), reverse=True
    )
    assert list(table[0])[:3] == ["trial", "status", "optim.lr"] and "val/acc" in table[0]
    assert {x["trial"] for x in table} == {"0", "1"}
    none = run_cli(
        "sweep", "table", "--json", "--filter", "status=failed", str(short_sweep), cwd=short_sweep
    )
    assert json.loads(none.stdout)["trials"] == []
    some = run_cli(
        "sweep",
        "table",
        "--filter",
        "status=failed",
        "--filter",
        "status=completed",
        "--sort",
        "trial",
        str(short_sweep),
        cwd=short_sweep,
    ).stdout
    assert "(2 of 2 trial(s): 2 completed;" in some
    assert [line.split()[0] for line in some.splitlines()[2:]] == ["0", "1"]


def test_sweep_results_in_python(short_sweep: Path) -> None:
    import expctl

    results = expctl.sweep_results(short_sweep)
    assert [r.number for r in results] == [0, 1] and results.metric == "val/acc"
    records = results.records()
    assert records[0]["trial"] == 0 and isinstance(records[0]["optim.lr"], float)
    assert records[0]["val/acc"] == results.rows[0].value
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(expctl.UserError, match="needs pandas"):
            results.to_pandas()
    else:
        frame = results.to_pandas()
        assert list(frame.index) == [0, 1] and frame["val/acc"].tolist() == [
            r.value for r in results
        ]


def test_plot_writes_what_two_trials_allow_and_says_what_it_skipped(short_sweep: Path) -> None:
    out = run_cli("sweep", "plot", str(short_sweep), cwd=short_sweep).stdout
    for name in ("intermediate_values", "slice"):
        png = short_sweep / f"plot_{name}.png"
        assert f"wrote {png}" in out and _is_png(png)
    assert "skipped plot_param_importances: only one swept parameter" in out
    assert "skipped plot_parallel_coordinate" in out
    assert not (short_sweep / "plot_param_importances.png").exists()


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def _driver(tiny: Path, *args: str, slow: str = "0.05") -> subprocess.Popen[str]:
    """`expctl run -C tiny.yml -m ARGS` as a real process of its own (slow steps: time to act)."""
    return subprocess.Popen(
        [sys.executable, "-m", "expctl", "run", "-C", str(tiny), "-m", *args],
        cwd=tiny.parent,
        env=cli_env(SLOW_STEP_S=slow),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C and the hang-up as a terminal's foreground program gets them, even when these
        # tests run from a background job or under nohup (their SIGINT or SIGHUP is ignored, and
        # an ignored signal is inherited: a sweep under nohup rightly ignores the hang-up)
        preexec_fn=_default_signals,
    )


def _wait_for(what: str, ready: Any, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _trial_pid(trial_dir: Path) -> int:
    from expctl.jobs.study import TrialRef, attrs_of

    ref = TrialRef.read(trial_dir)
    assert ref is not None
    return int(attrs_of(ref)["pid"])


def _one_at_a_time(
    tiny: Path, grid: str, trial: int, *extra: str, slow: str = "0.05"
) -> tuple[subprocess.Popen[str], Path]:
    """A driver of slow trials one at a time, once trial `trial` has written a checkpoint."""
    driver = _driver(
        tiny, grid, "sweep.max_concurrent=1", "imports=[faulty]", "train.step=slow",
        "checkpoint.every=5", *extra, slow=slow,
    )  # fmt: skip
    sweep = tiny.parent / "runs"
    _wait_for(
        f"a checkpoint of trial {trial}",
        lambda: list(sweep.glob(f"sweep-*/trial_{trial:03d}/checkpoints/*.pt")),
    )
    (path,) = sweep.glob("sweep-*")
    return driver, path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_trials_run_side_by_side_each_on_its_own_cores(tiny: Path) -> None:
    """Two trials at once on this 2-core machine (the default: as many as the cores allow), each
    pinned to its own core (each waits at its first step until the other trains too); the
    console shows a line per trial start and end, not their logs, which are in each trial's
    train.log and output.log."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.1,0.2",
        "imports=[faulty]",
        "train.step=meet",
        "train.max_epochs=1",
        cwd=tiny.parent,
        env=cli_env(MEET_DIR=str(tiny.parent / "met"), MEET_N="2"),
    )
    sweep = sweep_dir_of(proc.stdout)
    assert "2 trial(s) at a time on 2 core(s): no GPU, 1 core(s) each" in proc.stdout
    assert "train epoch" not in proc.stdout, "the trials' logs are not interleaved here"
    cores = set()
    for n in (0, 1):
        assert re.search(rf"trial {n} started \(cores \d\): optim\.lr=0\.[12]\n", proc.stdout)
        assert re.search(
            rf"trial {n} completed in [0-9.]+ s: val/acc=[0-9.]+ at step 16", proc.stdout
        )
        output = (sweep / f"trial_{n:03d}" / "output.log").read_text()
        assert "train epoch 1 step 16/16" in output
        cores.add(re.search(r"sweep trial \(cores (\d)\)", output).group(1))  # type: ignore[union-attr]
        launch = json.loads((sweep / f"trial_{n:03d}" / "provenance.json").read_text())["launches"][
            -1
        ]
        assert launch["attempts"][-1]["cpus_usable"] == 1
    assert cores == {"0", "1"} and len(list((tiny.parent / "met").iterdir())) == 2


# a driver that runs another thread when the sweep starts (as a notebook's kernel does); -P:
# its own imports do not search the working directory either
THREADED_DRIVER = """\
import sys, threading, time
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
from expctl.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="python -P is 3.11's")
def test_a_driver_with_threads_starts_its_trials_from_a_fresh_zygote(tiny: Path) -> None:
    """A driver that runs another thread does not fork: its trials come from a zygote started
    as a fresh interpreter, which does not search the working directory first (a json.py there
    would run in every trial). (A thread that an `imports:` module starts comes after the
    zygote, which the sweep starts first: that one forks.)"""
    (tiny.parent / "json.py").write_text("raise SystemExit('the working directory was searched')\n")
    parents = tiny.parent / "parents.txt"
    args = ["-m", "optim.lr=0.1,0.2", "imports=[threaded]", "train.step=parent_cmdline"]
    proc = subprocess.run(
        [sys.executable, "-P", "-c", THREADED_DRIVER, "run", "-C", str(tiny), *args]
        + ["train.max_steps=2"],
        cwd=tiny.parent,
        env=cli_env(PARENT_FILE=str(parents)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = ledger.rows(sweep_dir_of(proc.stdout))
    assert [r.status for r in rows] == ["completed", "completed"]
    written = parents.read_text()  # one line per step, of 2 trials x 2 steps
    assert written.count(" _zygote") == 4 and "expctl run" not in written, written


def test_ctrl_c_stops_every_running_trial_at_a_checkpoint_and_resume_finishes_them(
    tiny: Path,
) -> None:
    """Ctrl-C while two trials run: both save a checkpoint where they stopped (inside their
    first epoch: not a periodic one), the third never starts, exit 130 naming `sweep resume`,
    which continues the two from their checkpoints and runs the third."""
    driver = _driver(
        tiny,
        "optim.lr=0.1,0.2,0.3",
        "sweep.max_concurrent=2",
        "imports=[faulty]",
        "train.step=slow",
        "train.max_epochs=2",
        slow="0.25",  # 4 s an epoch: the Ctrl-C lands inside the first, never at its end
    )
    sweep = tiny.parent / "runs"
    metrics = [lambda n=n: list(sweep.glob(f"sweep-*/trial_{n:03d}/metrics.jsonl")) for n in (0, 1)]
    _wait_for("both trials training", lambda: all(m() for m in metrics))
    os.kill(driver.pid, signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130 and "Traceback" not in out, out
    how = re.search(r"to resume from the last checkpoint: expctl sweep resume (\S+)", out)
    assert how, out
    path = Path(how.group(1))
    cut = ledger.rows(path)
    assert [r.status for r in cut] == ["interrupted", "interrupted", "pending"]
    for n in (0, 1):
        newest = max(
            int(p.stem.split("_")[1])
            for p in (path / f"trial_{n:03d}").glob("checkpoints/step_*.pt")
        )
        assert newest % 16 != 0, "saved where it stopped, not at an epoch end"
        said = (path / f"trial_{n:03d}" / "output.log").read_text()
        assert f"`expctl sweep resume {path}` continues it" in said, said  # not `run.dir=...`
    table = run_cli("sweep", "table", str(path), cwd=tiny.parent).stdout
    assert "3 trial(s) not run to the end" in table and "interrupted" in table
    run_cli("sweep", "resume", str(path), cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    done = ledger.rows(path)
    assert [r.status for r in done] == ["completed"] * 3
    for n in (0, 1):
        assert "resumed from" in (path / f"trial_{n:03d}" / "train.log").read_text()
        # its wall time: both attempts' (the table showed the last one's alone)
        assert (done[n].wall_s or 0) > (cut[n].wall_s or 0) > 1.0, (done[n], cut[n])


def test_a_lost_attempt_lasted_until_the_last_row_it_wrote(tmp_path: Path) -> None:
    """A trial whose driver was killed never recorded its end: its wall time in the table runs
    to its last metrics row before the retry began (the table counted it as 0)."""
    rows = [{"step": 1, "time": 101.0}, {"step": 2, "time": 105.0}, {"step": 3, "time": 160.0}]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ledger._wall({"started": 100.0}, {"started": 150.0}, metrics) == 5.0
    assert ledger._wall({"started": 100.0, "ended": 130.0}, {"started": 150.0}, metrics) == 30.0
    assert ledger._wall({"started": 100.0}) is None, "still running: no wall time yet"


def test_a_launch_refused_on_a_running_trial_leaves_the_trial_alone(tiny: Path) -> None:
    """`expctl run` on a running trial's directory is refused (another launch trains it), and
    changes nothing: it marked the trial failed in the ledger, and the trial died of that."""
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2", trial=0, slow="0.25")
    trial = path / "trial_000"
    refused = run_cli(
        "run", "-C", str(trial / "config.yaml"), f"run.dir={trial}", cwd=tiny.parent, check=False
    )  # fmt: skip
    assert refused.returncode == 2 and "is in use by another launch" in refused.stderr, refused
    assert [r.status for r in ledger.rows(path)][0] == "running"
    out, _ = driver.communicate(timeout=180)
    assert driver.returncode == 0, out
    assert [r.status for r in ledger.rows(path)] == ["completed"] * 2, out


def test_a_closed_console_loses_its_lines_not_the_sweep(tiny: Path) -> None:
    """`expctl run -m ... | head`: once the pipe's reader is gone, the sweep trains on to the
    end, printing nowhere (it stopped every trial, calling the broken pipe a full disk)."""
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2", trial=0)
    assert driver.stdout is not None
    driver.stdout.close()
    assert driver.wait(timeout=180) == 0
    assert [r.status for r in ledger.rows(path)] == ["completed"] * 2


def test_a_hang_up_stops_the_trials_at_a_checkpoint_and_resume_finishes_them(tiny: Path) -> None:
    """The terminal closed: the sweep's process group gets SIGHUP, its console is gone. As with
    Ctrl-C, the running trial stops at a checkpoint and `sweep resume` continues it (the driver
    and its zygote died of it: the trial with them, `lost`)."""
    # 8 epochs: the sweep still runs when the signal comes, however late a loaded machine
    # lets this test send it (2 epochs ended it first once, under CI's load: exit 0)
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2", 0, "train.max_epochs=8", slow="0.25")
    assert driver.stdout is not None
    driver.stdout.close()
    os.killpg(driver.pid, signal.SIGHUP)
    assert driver.wait(timeout=120) == 128 + signal.SIGHUP, (
        "a shell says so of a process SIGHUP ended"
    )
    assert [r.status for r in ledger.rows(path)] == ["interrupted", "pending"]
    run_cli("sweep", "resume", str(path), cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    assert [r.status for r in ledger.rows(path)] == ["completed"] * 2
    assert "resumed from" in (path / "trial_000" / "train.log").read_text()


def test_a_killed_driver_leaves_lost_trials_that_resume_continues(tiny: Path) -> None:
    """SIGKILL of the sweep's driver during trial 1 of a 4-point grid (one at a time): no trial
    trains on; the table lists all 4 (1 lost, 2 never started); resumed, trial 1 continues from
    its checkpoint, each trial's number is its directory's and no number is skipped."""
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2,0.3,0.01", trial=1)
    pid = _trial_pid(path / "trial_001")
    os.kill(driver.pid, signal.SIGKILL)
    driver.communicate(timeout=60)
    _wait_for("the trial to die with its driver", lambda: not _alive(pid), timeout=30)
    statuses = [r.status for r in ledger.rows(path)]
    assert statuses == ["completed", "lost", "pending", "pending"], statuses
    table = run_cli("sweep", "table", str(path), cwd=tiny.parent).stdout
    assert "(4 trial(s): 2 pending, 1 completed, 1 lost;" in table, table
    assert re.search(r"\n +3  pending .* optim\.lr=0\.01\n", table), table
    assert f"3 trial(s) not run to the end: `expctl sweep resume {path}`" in table
    original = tiny.read_text()
    tiny.write_text(original.replace("momentum: 0.9", "momentum: 0.5"))
    edited = run_cli("sweep", "resume", str(path), cwd=tiny.parent, check=False)
    assert edited.returncode == 2, edited.stderr
    assert "config changed since it started (optim.momentum=0.9 then, 0.5 now)" in edited.stderr
    tiny.unlink()
    gone = run_cli("sweep", "resume", str(path), cwd=tiny.parent, check=False)
    assert gone.returncode == 2 and f"-C {tiny} is gone" in gone.stderr, gone.stderr
    tiny.write_text(original)
    moved = tiny.parent / "elsewhere" / path.name  # a sweep moves as a run does (issue 28 #5)
    moved.parent.mkdir()
    shutil.move(path, moved)
    path = moved
    table = run_cli("sweep", "table", str(path), cwd=tiny.parent).stdout
    assert "(4 trial(s): 2 pending, 1 completed, 1 lost;" in table, table
    run_cli("sweep", "resume", str(path), cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    rows = ledger.rows(path)
    assert [r.status for r in rows] == ["completed"] * 4
    assert all(Path(r.run_dir).parent == path for r in rows), [r.run_dir for r in rows]
    assert (path / "best.yml").is_file()
    assert [Path(r.run_dir).name for r in rows] == [f"trial_{n:03d}" for n in range(4)]
    assert [r.number for r in rows] == [0, 1, 2, 3] and rows[1].optuna_trial != 1, "a retry"
    assert sorted(p.name for p in path.glob("trial_*")) == [f"trial_{n:03d}" for n in range(4)]
    assert [r.overrides for r in rows] == [f"optim.lr={x}" for x in ("0.1", "0.2", "0.3", "0.01")]
    assert "resumed from" in (path / "trial_001" / "train.log").read_text()
    listed = json.loads(run_cli("sweep", "table", "--json", str(path), cwd=tiny.parent).stdout)
    assert {(t["trial"], Path(t["run_dir"]).name) for t in listed["trials"]} == {
        (n, f"trial_{n:03d}") for n in range(4)
    }


def test_a_disk_that_fills_during_a_sweep_stops_it_in_one_line_and_resume_finishes_it(
    tiny: Path, tmp_path: Path
) -> None:
    """The sweep's filesystem fills while trial 1 trains: one line (exit 1) naming the sweep and
    `sweep resume`; nothing is left pending for ever: once space is freed, resume runs every
    trial that did not complete, and a second resume has nothing left to do."""
    import conftest

    with conftest.tmpfs(tmp_path / "disk", 4096) as disk:
        proc = run_cli(
            "run",
            "-C",
            str(tiny),
            "-m",
            "optim.lr=0.1,0.2,0.3",
            "sweep.max_concurrent=1",
            "imports=[faulty]",
            "train.step=fill_disk_at_step",
            "train.max_epochs=1",
            f"run.root={disk}",
            cwd=tiny.parent,
            env=cli_env(FILL_DIR=str(disk), FILL_AT_STEP="5"),
            check=False,
        )
        err = [line for line in proc.stderr.splitlines() if line.startswith(("expctl", " "))]
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        path = sweep_dir_of(proc.stdout)
        assert "No space left on device" in err[-2] + err[-1], proc.stderr
        assert f"expctl sweep resume {path}" in err[-1], proc.stderr
        rows = ledger.rows(path)
        assert all(r.status in ("failed", "lost") for r in rows if r.optuna_trial is not None)
        assert all(r.status == "pending" for r in rows if r.optuna_trial is None), rows
        (disk / "filler").unlink()
        run_cli("sweep", "resume", str(path), cwd=tiny.parent)
        assert [r.status for r in ledger.rows(path)] == ["completed"] * 3
        again = run_cli("sweep", "resume", str(path), cwd=tiny.parent)
        assert "nothing to resume" in again.stdout


def test_a_killed_zygote_ends_the_sweep_in_one_line_and_resume_finishes_it(tiny: Path) -> None:
    """SIGKILL of the process that forks the trials (found by a new user): its running trial dies
    with it; the driver says so in one line with the resume command (it was a traceback), exit 1,
    and `sweep resume` finishes the sweep from the trial's checkpoint."""
    driver, path = _one_at_a_time(tiny, "optim.lr=0.1,0.2", trial=0)
    pid = _trial_pid(path / "trial_000")
    zygote = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(zygote, signal.SIGKILL)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 1 and "Traceback" not in out, out
    assert "zygote process (the trials' forker) ended" in out, out
    assert f"`expctl sweep resume {path}` resumes them" in out, out
    _wait_for("the trial to die with its zygote", lambda: not _alive(pid), timeout=30)
    assert [r.status for r in ledger.rows(path)][0] == "lost"
    run_cli("sweep", "resume", str(path), cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    assert [r.status for r in ledger.rows(path)] == ["completed"] * 2
    assert "resumed from" in (path / "trial_000" / "train.log").read_text()


def test_a_trial_asked_by_a_driver_that_died_is_lost_and_resumed(tiny: Path) -> None:
    """A trial the journal holds as pending (asked, its folder not made yet) whose driver is gone
    is `lost`, not pending for ever: `sweep resume` runs it."""
    from expctl.config import frozen as config
    from expctl.jobs.study import open_study

    proc = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=0.1", "train.max_steps=2", cwd=tiny.parent
    )
    path = sweep_dir_of(proc.stdout)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    study = open_study(path, config.load(path / "trial_000").sweep)
    trial = study.ask()
    for k, v in {
        "status": "pending",
        "pid": int(dead.stdout),
        "host": os.uname().nodename,
        "overrides": "optim.lr=0.1",
        "config": "{}",
        "run_dir": str(path / "trial_001"),
    }.items():
        trial.set_user_attr(k, v)
    rows = ledger.rows(path)
    assert [r.status for r in rows] == ["completed", "lost"]
    run_cli("sweep", "resume", str(path), cwd=tiny.parent)
    assert [r.status for r in ledger.rows(path)] == ["completed", "completed"]


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
    """Two trials at once: the rule judges a trial against those that completed, so which one
    it stops depends on their order; this checks what holds in every order. lr=0.1 is ahead of
    lr=0.05 at every epoch: never stopped. lr=1e-5 starts once an earlier trial ended (the first
    to end completed: nothing is stopped before one did): stopped at epoch 1."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "optim.lr=0.1,0.05,0.00001",
        "train.max_epochs=3",
        "sweep.pruner=median",
        "sweep.max_concurrent=2",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    rows = {r.overrides: r for r in ledger.rows(sweep)}
    _ended_within_budget(rows, 3)
    assert rows["optim.lr=0.1"].status == "completed"
    assert (rows["optim.lr=1e-05"].status, rows["optim.lr=1e-05"].epoch) == ("stopped", 1)
    out = run_cli("sweep", "plot", str(sweep), cwd=tiny.parent).stdout
    png = sweep / "plot_intermediate_values.png"
    assert str(png) in out and _is_png(png)


def test_a_finished_trial_reruns_and_continues_as_a_run_of_its_own(
    tiny: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Re-running a completed trial's directory trains nothing; training it further there is
    refused (the sweep's table and best.yml read that folder), and its hint continues it as a
    run of its own; neither writes to the sweep's journal; how the sweep ran its trials
    (sweep.max_concurrent) is not the trial's config; relative sweep paths give no false
    warnings."""
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=0.01,0.1", "sweep.max_concurrent=1", cwd=tiny.parent
    )
    sweep = sweep_dir_of(proc.stdout)
    journal = (sweep / "journal.log").read_bytes()
    trial = sweep / "trial_000"
    args = ["run", "-C", str(tiny), "optim.lr=0.01", f"run.dir={trial}"]
    again = run_cli(*args, cwd=tiny.parent)
    assert "already completed" in again.stdout and "Traceback" not in again.stderr
    before = (trial / "result.json").read_bytes()
    more = run_cli(*args, "train.max_epochs=3", cwd=tiny.parent, check=False)
    assert more.returncode == 2 and "which recorded its end" in more.stderr, more.stderr
    assert (trial / "result.json").read_bytes() == before
    hint = more.stderr.split("HINT: train it as a run of its own: expctl ")[1].split(" (and")[0]
    own = tiny.parent / "own"
    hinted = [w.replace("NEW_DIR", str(own)) for w in hint.split()]
    cont = run_cli(*hinted, "train.max_epochs=3", cwd=tiny.parent)
    assert "resumed from" in cont.stdout, cont.stdout
    assert json.loads((own / "result.json").read_text())["epoch"] == 3
    assert (sweep / "journal.log").read_bytes() == journal
    # from inside the sweep's folder, best.yml trains into runs/ there: no trial's place
    inside = run_cli("run", "-C", "best.yml", "train.max_epochs=1", cwd=sweep)
    assert f"{sweep}/runs/" in inside.stdout, inside.stdout
    relative = run_cli("sweep", "table", str(sweep.relative_to(tiny.parent)), cwd=tiny.parent)
    assert "warning" not in relative.stderr, relative.stderr
    # a trial's folder replaced by another's (trial.json of trial 0): named, never read as its
    top = run_cli("sweep", "best", str(sweep), cwd=tiny.parent).stdout
    shutil.rmtree(sweep / "trial_001")
    shutil.copytree(trial, sweep / "trial_001")
    table = run_cli("sweep", "table", str(sweep), cwd=tiny.parent)
    assert "trial_001: a run the sweep did not start" in table.stderr, table.stderr
    assert "its folder holds a run the sweep did not start" in table.stdout
    # the same trial number from another sweep (its trial.json names that sweep): named too
    ref = json.loads((trial / "trial.json").read_text())
    assert ref["sweep_id"] == json.loads((sweep / "sweep.json").read_text())["created"]
    (trial / "trial.json").write_text(json.dumps({**ref, "sweep_id": ref["sweep_id"] + 1}))
    with caplog.at_level(logging.WARNING, logger="expctl"):
        assert [r.foreign for r in ledger.rows(sweep)] == [True, True]
        ledger.rows(sweep)  # read again (a driver does, per trial): said once per folder
    told = [m for m in caplog.messages if "a run the sweep did not start" in m]
    assert len(told) == 1 and "trial_000" in told[0] and "trial_001" in told[0], told
    (trial / "trial.json").write_text(json.dumps(ref))
    again = run_cli("sweep", "best", str(sweep), cwd=tiny.parent, check=False)
    if top.startswith("best trial 1:"):
        assert again.returncode == 2 and "best.yml not written" in again.stderr, again.stderr
    else:
        assert again.returncode == 0 and again.stdout.startswith("best trial 0:")


def test_a_three_parameter_tpe_sweep_plots_every_view(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "experiment=debug",
        "sweep=tpe",
        "sweep.n_trials=4",
        "optim.lr=tag(log, interval(0.001, 0.5))",
        "optim.momentum=interval(0.0, 0.9)",
        "model.hidden=choice([8],[16])",
        cwd=tiny.parent,
    )
    sweep = sweep_dir_of(proc.stdout)
    out = run_cli("sweep", "plot", str(sweep), cwd=tiny.parent).stdout
    names = ("intermediate_values", "slice", "param_importances", "parallel_coordinate")
    for name in names:
        png = sweep / f"plot_{name}.png"
        assert f"wrote {png}" in out and _is_png(png), out
    assert "skipped" not in out

    import matplotlib.figure

    from expctl.sweep import plots

    figures = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig: matplotlib.figure.Figure, *args: object, **kwargs: object) -> None:
        figures.append(fig)
        save(fig, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    plots.plot(sweep)
    scales = {ax.get_xlabel(): ax.get_xscale() for ax in figures[1].axes if ax.get_xlabel()}
    assert scales["optim.lr"] == "log" and scales["optim.momentum"] == "linear", scales


@pytest.mark.filterwarnings("ignore:.*is experimental")
def test_the_progress_plot_stays_legible_with_50_trials() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.visualization.matplotlib import plot_intermediate_values

    from expctl.config.schema import SweepConfig
    from expctl.sweep import plots

    def study(n: int) -> optuna.Study:
        s = optuna.create_study()
        for i in range(n):
            done = optuna.trial.TrialState.COMPLETE
            values = {e: i / (e + 1) for e in range(1, 4)}
            s.add_trial(optuna.trial.create_trial(state=done, value=i, intermediate_values=values))
        return s

    few = plots.progress_figure(plot_intermediate_values(study(3)), SweepConfig(), 3)
    assert few.get_legend() is not None and few.get_xlabel() == "epoch"
    assert "stopped" not in few.get_title()
    many = plots.progress_figure(plot_intermediate_values(study(50)), SweepConfig(), 50)
    assert many.get_legend() is None and "50 trials" in many.get_title()
    assert all(t == int(t) for t in many.get_xticks()), "whole epochs"


def test_best_yml_runs_from_another_directory_with_its_neighbour_module(neighbour: Path) -> None:
    """The sweep found `imports: [neighbour_models]` beside its -C file; its best.yml, run from
    a directory where nothing is beside it, still finds the module."""
    root = neighbour.parent.parent
    proc = run_cli(
        "run",
        "-C",
        str(neighbour),
        "-m",
        "optim.lr=0.05,0.1",
        "train.max_steps=2",
        cwd=root / "elsewhere",
    )
    sweep = sweep_dir_of(proc.stdout)
    run_cli("sweep", "best", str(sweep), cwd=root)
    again = run_cli("run", "-C", str(sweep / "best.yml"), "train.max_steps=2", cwd=root)
    assert "results in" in again.stdout and "neighbour_mlp" in again.stdout


def test_a_misspelt_sweep_metric_fails_the_trial_before_it_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a user trial: every trial used to train in full, then fail on the missing metric."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["run", "-m", *SMALL, "sweep.metric=val/accuracy", "optim.lr=0.1,0.2"])
    out, err = capsys.readouterr()
    assert code == 1, "every trial failed: the sweep ends in one RunError line"
    assert "sweep.metric" in out + err and "Did you mean 'val/acc'" in out + err, out + err
    assert not list(tmp_path.rglob("metrics.jsonl")) or all(
        p.stat().st_size == 0 for p in tmp_path.rglob("metrics.jsonl")
    ), "no trial trained"


def test_resume_refuses_a_sweep_whose_config_group_file_changed(tiny: Path) -> None:
    """A group file beside the -C file (optim/fast.yaml) edited between start and resume: the
    trials not yet run would train another configuration than the ones that ran; refused,
    naming the values; restored, the resume runs."""
    group = tiny.parent / "optim"
    group.mkdir()
    (group / "fast.yaml").write_text("{name: sgd, lr: 0.1, momentum: 0.9}\n")
    cfg = tiny.parent / "grouped.yml"
    cfg.write_text("defaults: [{optim: fast}]\n" + tiny.read_text().replace("optim:", "#optim:"))
    proc = run_cli(
        "run", "-C", str(cfg), "-m", "data.batch_size=100000,16", "sweep.stop_on_failure=true",
        "sweep.max_concurrent=1", cwd=tiny.parent, check=False,
    )  # fmt: skip
    sweep = sweep_dir_of(proc.stdout)
    assert [r.status for r in ledger.rows(sweep)] == ["failed", "pending"], proc.stdout
    (group / "fast.yaml").write_text("{name: sgd, lr: 0.5, momentum: 0.9}\n")
    journal = (sweep / "journal.log").read_bytes()
    refused = run_cli("sweep", "resume", "--skip-failed", str(sweep), cwd=tiny.parent, check=False)
    assert refused.returncode == 2, refused.stderr
    assert "the sweep's config changed since it started (optim.lr=0.1 then, 0.5 now)" in (
        refused.stderr
    )
    assert (sweep / "journal.log").read_bytes() == journal
    (group / "fast.yaml").write_text("{name: sgd, lr: 0.1, momentum: 0.9}\n")
    with cfg.open("a") as f:  # a comment changes no value: no refusal
        f.write("# tried on Monday\n")
    run_cli("sweep", "resume", "--skip-failed", str(sweep), cwd=tiny.parent, check=False)
    assert [r.status for r in ledger.rows(sweep)] == ["failed", "completed"]
    assert config.load(ledger.rows(sweep)[1].run_dir).optim.args["lr"] == 0.1
    # a group file that only a later grid point picks (optim=slow)
    (group / "slow.yaml").write_text("{name: sgd, lr: 0.001, momentum: 0.5}\n")
    proc = run_cli(
        "run", "-C", str(cfg), "-m", "optim=slow,fast", "data.batch_size=100000,16",
        "sweep.stop_on_failure=true", "sweep.max_concurrent=1", cwd=tiny.parent, check=False,
    )  # fmt: skip
    later = sweep_dir_of(proc.stdout)
    (group / "fast.yaml").write_text("{name: sgd, lr: 0.9, momentum: 0.0}\n")
    refused = run_cli("sweep", "resume", "--skip-failed", str(later), cwd=tiny.parent, check=False)
    assert refused.returncode == 2 and "composes otherwise now" in refused.stderr, refused.stderr
    assert "trial 2's config (data.batch_size=100000 optim=fast)" in refused.stderr


def test_a_configuration_with_fewer_than_two_completed_seeds_has_no_spread() -> None:
    """--repeat with a pruner: one seed left (or none) has no ± std (it read 0, as if the seeds
    had agreed); a repeat of the base config is labelled (base), not `seed#1`."""

    def row(n: int, status: str, value: float | None, seed_idx: int, overrides: str) -> ledger.Row:
        return ledger.Row(
            n, status, overrides, "{}", value, value, 3, 1.0, "", f"t{n}", {}, 9, seed_idx
        )

    one = [
        row(0, "completed", 0.9, 0, "optim.lr=0.1"),
        row(1, "stopped", 0.5, 1, "optim.lr=0.1 seed#1"),
    ]
    none = [row(2, "stopped", 0.4, 0, ""), row(3, "stopped", 0.3, 1, "seed#1")]
    two = [row(4, "completed", 0.9, 0, ""), row(5, "completed", 0.7, 1, "seed#1")]
    assert aggregate.std(one) is None and aggregate.mean(one) == 0.9
    assert aggregate.std(none) is None and aggregate.mean(none) is None
    assert aggregate.std(two) == pytest.approx(0.1414, abs=1e-4)
    assert [aggregate.config_label(r) for r in (*one, *none)] == (
        ["optim.lr=0.1"] * 2 + ["(base)"] * 2
    )


def test_a_run_without_m_says_its_search_space_is_not_swept(tiny: Path) -> None:
    cfg = tiny.parent / "space.yml"
    cfg.write_text('sweep: {params: {optim.lr: "0.1,0.2"}}\n' + tiny.read_text())
    proc = run_cli("run", "-C", str(cfg), "train.max_steps=1", cwd=tiny.parent)
    assert "note: sweep.params (optim.lr) is the search space of a sweep" in proc.stderr


def test_a_misspelt_sweep_metric_stops_the_sweep_at_the_first_trial(tiny: Path) -> None:
    """Every trial validates alike: the first that fails on sweep.metric says why, and the rest
    do not start (they would each fail the same way)."""
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "sweep.metric=val/accc", "optim.lr=0.1,0.2,0.3",
        "sweep.max_concurrent=1", cwd=tiny.parent, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Did you mean 'val/acc'?" in proc.stdout and "stopping the sweep" in proc.stdout
    assert [r.status for r in ledger.rows(sweep_dir_of(proc.stdout))] == [
        "failed",
        "pending",
        "pending",
    ]


def test_a_sweep_notes_a_loss_maximised_and_a_run_dir_it_sets_aside(tiny: Path) -> None:
    cfg = tiny.parent / "frozen.yml"
    cfg.write_text(f"run: {{dir: {tiny.parent / 'one_run'}}}\n" + tiny.read_text())
    proc = run_cli(
        "run", "-C", str(cfg), "-m", "sweep.metric=val/loss", "optim.lr=0.1,0.2",
        "train.max_steps=2", cwd=tiny.parent,
    )  # fmt: skip
    assert "note: sweep.metric=val/loss with sweep.mode=max: the best trial is" in proc.stderr
    assert f"note: run.dir={tiny.parent / 'one_run'} of the -C file names one run's" in proc.stderr
    assert not (tiny.parent / "one_run").exists()
