"""Re-using a run directory: one metrics history across resumes, completed runs left alone,
runs never overwritten by a new launch, and errors that say how to start from a run's weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY, cli_env, run_dirs, tree, wait_for
from conftest import expctl as run_cli

import expctl
from expctl.config import compose
from expctl.config.schema import Config
from expctl.errors import UserError
from expctl.rank import checkpoint, retention, rundir

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow

KILL = ["imports=[faulty]", "train.step=kill_at_step"]
NOISE = ("time", "perf/samples_per_s")


def history(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the fields that differ between identical runs."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in NOISE} for r in rows]


def shape(rows: list[dict[str, Any]]) -> list[tuple[int, int, tuple[str, ...]]]:
    """Which event was logged when."""
    return [(r["step"], r["epoch"], tuple(sorted(r))) for r in rows]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(retention.list_checkpoints(run_dir)[0])["models"]["model"]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run that the interrupted ones must match (tiny config, 2 epochs)."""
    import conftest

    work = tmp_path_factory.mktemp("ref")
    (work / "tiny.yml").write_text(conftest.TINY)
    run_cli("run", "-C", "tiny.yml", *KILL, "run.dir=ref", cwd=work)
    return work / "ref"


# --- 1. one history after a resume ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("every", "kill_at"),
    [
        (6, 23),  # checkpoint at 18, a train row at 20 logged after it
        (8, 18),  # checkpoint at 16 = the epoch's last step: the epoch's val row follows it
        (0, 10),  # killed before the first checkpoint: rows at 4 and 8, then a fresh start
    ],
    ids=["rows-past-checkpoint", "val-row-at-checkpoint-step", "no-checkpoint-yet"],
)
def test_rerun_after_a_kill_logs_one_history(
    every: int, kill_at: int, reference: Path, tiny: Path
) -> None:
    args = ["run", "-C", str(tiny), *KILL, f"checkpoint.every={every}", "run.dir=cut"]
    metrics = tiny.parent / "cut" / "metrics.jsonl"
    killed = run_cli(*args, cwd=tiny.parent, env=cli_env(KILL_AT_STEP=str(kill_at)), check=False)
    assert killed.returncode == -9, killed.stderr
    before = metrics.read_text().splitlines()
    resumed = run_cli(*args, cwd=tiny.parent)
    got, ref = history(tiny.parent / "cut"), history(reference)
    assert shape(got) == shape(ref), f"logged before the kill: {before}"
    assert got == ref, "the same values: a train row after the checkpoint averages its window"
    saved = every * ((kill_at - 1) // every) if every else 0  # the step resumed from
    kept = sum(json.loads(x)["step"] < saved for x in before)
    assert metrics.read_text().splitlines()[:kept] == before[:kept], "earlier rows kept as is"
    assert ("resumed from" in resumed.stdout) == bool(every)
    assert "metrics.jsonl: dropped" in (tiny.parent / "cut" / "train.log").read_text()
    assert same_weights(tiny.parent / "cut", reference)


def test_restarted_workers_log_one_history_even_with_resume_never(tiny: Path) -> None:
    """launcher.max_restarts: the workers a kill restarts continue the launch's own checkpoints
    (checkpoint.resume=never refuses only a new launch) and drop the rows past them."""
    args = [
        "run",
        "-C",
        str(tiny),
        *KILL,
        "checkpoint.every=5",
        "data.batch_size=16",
        "launcher=local",
        "launcher.nproc=2",
        "launcher.max_restarts=1",
        "train.max_epochs=1",
        "checkpoint.resume=never",
    ]
    run_cli(*args, "run.dir=ref", cwd=tiny.parent)
    proc = run_cli(  # checkpoint at step 10, a train row at 12, killed in step 14
        *args, "run.dir=cut", cwd=tiny.parent, env=cli_env(KILL_AT_STEP="14", KILL_RANK="1")
    )
    assert "resumed from" in proc.stdout and "(step 10," in proc.stdout
    assert history(tiny.parent / "cut") == history(tiny.parent / "ref")
    assert same_weights(tiny.parent / "cut", tiny.parent / "ref")


def test_resume_at_an_epochs_last_step_with_leftover_micro_batches_is_exact(tiny: Path) -> None:
    """grad_accum=3 over 16 micro-batches: 15 are trained per epoch. A checkpoint of the epoch's
    last step resumes into the epoch's end, without training the 16th micro-batch."""
    args = ["run", "-C", str(tiny), "train.grad_accum=3", "checkpoint.every=5"]
    run_cli(*args, "train.max_steps=10", "run.dir=ref", cwd=tiny.parent)
    run_cli(*args, "train.max_steps=5", "run.dir=cut", cwd=tiny.parent)
    proc = run_cli(*args, "train.max_steps=10", "run.dir=cut", cwd=tiny.parent)
    assert "(step 5, epoch 1, batch 15)" in proc.stdout
    assert same_weights(tiny.parent / "cut", tiny.parent / "ref")
    got, ref = history(tiny.parent / "cut"), history(tiny.parent / "ref")
    assert shape(got) == shape(ref) and got == ref


def test_killed_before_result_json_finishes_as_the_uninterrupted_run(tiny: Path) -> None:
    """The last checkpoint (step 32, taken before the epoch's validation) exists, result.json
    does not: the re-run validates once, at the right epoch, and writes the same result."""
    args = ["run", "-C", str(tiny), "checkpoint.every=8", "run.dir=r"]
    run_cli(*args, cwd=tiny.parent)
    result = tiny.parent / "r" / "result.json"
    before, rows = json.loads(result.read_text()), history(tiny.parent / "r")
    result.unlink()
    run_cli(*args, cwd=tiny.parent)
    after = json.loads(result.read_text())
    assert {k: v for k, v in after.items() if k != "time/train_s"} == {
        k: v for k, v in before.items() if k != "time/train_s"
    }
    assert history(tiny.parent / "r") == rows


# --- 2. a completed run is left alone --------------------------------------------------------------


def test_rerun_of_a_completed_run_returns_its_result_and_writes_nothing(
    tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_steps=20 stops mid-epoch (a final validation at step 20): re-running the same command,
    from the CLI or the Python API, trains and evaluates nothing; a higher max_steps continues."""
    args = ["-C", str(tiny), "train.max_steps=20", "run.dir=done"]
    first = run_cli("run", *args, cwd=tiny.parent)
    run_dir = tiny.parent / "done"
    files = snapshot(run_dir)
    again = run_cli("run", *args, cwd=tiny.parent)
    assert "already completed (step 20, epoch 2, batch 4)" in again.stdout
    assert f"results in {run_dir}" in again.stdout
    assert again.stdout.splitlines()[-2] == first.stdout.splitlines()[-2], "the stored result"
    assert snapshot(run_dir) == files
    monkeypatch.chdir(tiny.parent)
    result = expctl.run(str(tiny), ["train.max_steps=20", "run.dir=done"])
    assert result.metrics == json.loads((run_dir / "result.json").read_text())
    assert snapshot(run_dir) == files

    # other values that would train nothing are refused, naming them: its config stays its own
    for changed, named in [
        (["train.max_steps=20", "checkpoint.monitor=val/acc"], "monitor=None there, val/acc here"),
        (["train.max_steps=12"], "train.max_steps=20 there, 12 here"),
        (["train.max_steps=20", "train.max_epochs=1"], "train.max_epochs=2 there, 1 here"),
    ]:
        proc = run_cli(
            "run", "-C", str(tiny), *changed, "run.dir=done", cwd=tiny.parent, check=False
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"run.dir={run_dir} holds a completed run (step 20)" in proc.stderr
        assert named in proc.stderr and len(proc.stderr.strip().splitlines()) == 2
        assert snapshot(run_dir) == files
    # a longer run refused once built (a metric name the validation lacks): config.yaml as it was
    # (inline, and by local workers: their launcher held the directory and restores it)
    typo = ["train.max_steps=28", "checkpoint.monitor=val/acc_typo"]
    for where in ([], ["launcher=local", "launcher.nproc=2"]):
        proc = run_cli(
            "run", "-C", str(tiny), *typo, *where, "run.dir=done", cwd=tiny.parent, check=False
        )
        assert proc.returncode == 2 and "val/acc_typo" in proc.stderr, proc.stderr
        assert snapshot(run_dir) == files, where

    more = run_cli("run", "-C", str(tiny), "train.max_steps=28", "run.dir=done", cwd=tiny.parent)
    assert "resumed from" in more.stdout and "already completed" not in more.stdout
    assert json.loads((run_dir / "result.json").read_text())["step"] == 28
    steps = [r["step"] for r in history(run_dir)]
    assert steps == sorted(steps) and steps[-1] == 28


# --- 3. a new launch never overwrites a run --------------------------------------------------------


def frozen(tiny: Path, run_dir: Path, *overrides: str) -> Config:
    return compose.compose(str(tiny), [f"run.dir={run_dir}", *overrides])


def test_a_launch_with_resume_never_or_a_path_refuses_a_directory_holding_a_run(
    tiny: Path,
) -> None:
    d = tiny.parent / "held"
    rundir.create(frozen(tiny, d, "checkpoint.resume=never"), lock=False)
    rundir.create(frozen(tiny, d, "checkpoint.resume=never"), lock=False)  # a launch's workers
    (d / "checkpoints").mkdir()
    (d / "checkpoints" / "step_000000012.pt").write_bytes(b"")
    files = snapshot(d)
    other = tiny.parent / "other.pt"
    other.write_bytes(b"")
    for resume in ("never", str(other)):
        with pytest.raises(UserError) as e:
            rundir.create(frozen(tiny, d, f"checkpoint.resume={resume}"), lock=False)
        assert e.value.message == (
            f"run.dir={d} already holds a run (step 12); "
            f"checkpoint.resume={resume} would overwrite it"
        )
        assert e.value.hint == "use a new run.dir, or checkpoint.resume=auto to continue it"
        assert snapshot(d) == files
    rundir.create(frozen(tiny, d, "checkpoint.resume=never"), restart=True, lock=False)  # requeue
    rundir.create(frozen(tiny, d), lock=False)  # resume=auto continues it


def test_cli_refuses_before_any_worker_starts(tiny: Path) -> None:
    run_cli("run", "-C", str(tiny), "train.max_epochs=1", "run.dir=r", cwd=tiny.parent)
    files = snapshot(tiny.parent / "r")
    log = (tiny.parent / "r" / "train.log").read_text()
    for launcher in ("launcher=inline", "launcher=local"):
        proc = run_cli(
            "run",
            "-C",
            str(tiny),
            "train.max_epochs=1",
            "run.dir=r",
            "checkpoint.resume=never",
            launcher,
            cwd=tiny.parent,
            check=False,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].endswith(
            "already holds a run (step 16); checkpoint.resume=never would overwrite it"
        )
        assert lines[1] == "  HINT: use a new run.dir, or checkpoint.resume=auto to continue it"
        assert "local workers" not in proc.stdout
        assert snapshot(tiny.parent / "r") == files
        assert (tiny.parent / "r" / "train.log").read_text() == log


# --- 4. another config: say what differs and how to start from the run's weights ----------------


def test_another_config_names_the_values_and_the_checkpoint_to_start_from(tiny: Path) -> None:
    run_cli("run", "-C", str(tiny), "train.max_epochs=1", "run.dir=a", cwd=tiny.parent)
    a = tiny.parent / "a"
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "train.max_epochs=1",
        "optim.lr=0.01",
        "run.dir=a",
        cwd=tiny.parent,
        check=False,
    )
    ckpt = a / "checkpoints" / "step_000000016.pt"
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"expctl: error: run.dir={a} holds a run with a different config: "
        "optim.lr=0.1 there, 0.01 here",
        "  HINT: use a new run.dir; to start from its last checkpoint (weights, optimizer state, "
        f"step): checkpoint.resume={ckpt}",
    ]
    # following the hint continues that run in a new directory, exactly
    run_cli("run", "-C", str(tiny), "run.dir=full", cwd=tiny.parent)
    b = run_cli("run", "-C", str(tiny), "run.dir=b", f"checkpoint.resume={ckpt}", cwd=tiny.parent)
    assert f"resumed from {ckpt} (step 16, end of epoch 1)" in b.stdout
    assert same_weights(tiny.parent / "b", tiny.parent / "full")
    assert [r["step"] for r in history(tiny.parent / "b")][0] == 20
    # a changed learning rate does not apply: the checkpoint's optimizer state brings its own
    c = run_cli(
        "run",
        "-C",
        str(tiny),
        "run.dir=c",
        "optim.lr=0.01",
        f"checkpoint.resume={ckpt}",
        cwd=tiny.parent,
    )
    assert "restores that run's optimizer state: learning rate 0.1 (this config says 0.01)" in (
        c.stdout + c.stderr
    )


def test_restarted_workers_of_a_run_started_from_a_path_continue_their_own_checkpoint(
    tiny: Path,
) -> None:
    """checkpoint.resume=PATH is where the run started; a restart continues from the run's own
    newest checkpoint, not from PATH again."""
    run_cli("run", "-C", str(tiny), "train.max_epochs=1", "run.dir=start", cwd=tiny.parent)
    start = retention.list_checkpoints(tiny.parent / "start")[0]  # step 16, the end of epoch 0
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        *KILL,
        "data.batch_size=16",
        "launcher=local",
        "launcher.nproc=2",
        "launcher.max_restarts=1",
        "checkpoint.every=3",
        f"checkpoint.resume={start}",
        "run.dir=cut",
        cwd=tiny.parent,
        env=cli_env(KILL_AT_STEP="8", KILL_RANK="1"),  # in step 24: checkpoints at 18 and 21
    )
    own = tiny.parent / "cut" / "checkpoints" / "step_000000021.pt"
    assert f"resumed from {own} (step 21," in proc.stdout, proc.stdout
    steps = [r["step"] for r in history(tiny.parent / "cut") if "train/loss" in r]
    assert steps == [20, 24, 28, 32]


# --- 4. a run's identity is its directory, not the path written in it ------------------------------


def test_a_moved_run_resumes_where_it_is_and_its_config_starts_a_new_run(tiny: Path) -> None:
    run_cli("run", "-C", str(tiny), "train.max_steps=20", "run.dir=a", cwd=tiny.parent)
    assert "dir: null" in (tiny.parent / "a" / "config.yaml").read_text()
    (tiny.parent / "a").rename(tiny.parent / "b")
    moved = run_cli("run", "-C", str(tiny), "train.max_steps=28", "run.dir=b", cwd=tiny.parent)
    assert "resumed from" in moved.stdout
    assert json.loads((tiny.parent / "b" / "result.json").read_text())["step"] == 28
    files = snapshot(tiny.parent / "b")
    again = run_cli("run", "-C", str(tiny.parent / "b" / "config.yaml"), cwd=tiny.parent)
    assert "resumed from" not in again.stdout
    assert snapshot(tiny.parent / "b") == files, "the run it came from is untouched"
    (fresh,) = run_dirs(tiny.parent / "runs")
    assert json.loads((fresh / "result.json").read_text())["step"] == 28


# --- 4. one launch at a time on a run directory ----------------------------------------------------


def test_a_second_lock_on_a_run_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = rundir.RunLock(tmp_path)
    with pytest.raises(UserError) as e:
        rundir.RunLock(tmp_path)
    assert f"is in use by another launch (pid {os.getpid()} on host" in e.value.message
    assert rundir.is_locked(tmp_path) is not None
    first.release()
    assert rundir.is_locked(tmp_path) is None
    rundir.RunLock(tmp_path).release()


def test_two_launches_on_one_run_dir_train_once_and_a_relaunch_after_a_kill_resumes(
    tmp_path: Path,
) -> None:
    """A live run holds its directory: a second launch (even with a resumable change) exits 2
    naming the holder and changes nothing; after SIGKILL of the holder a relaunch resumes."""
    (tmp_path / "slow.yml").write_text(TINY + "imports: [faulty]\ncheckpoint: {every: 2}\n")
    args = ["run", "-C", "slow.yml", "train.step=slow", "run.dir=live"]
    env = cli_env(SLOW_STEP_S="0.2")
    first = subprocess.Popen(
        [sys.executable, "-m", "expctl", *args, "train.max_epochs=20"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        live = tmp_path / "live"
        wait_for("a checkpoint of the first launch", lambda: list(live.glob("checkpoints/*.pt")))
        os.killpg(first.pid, signal.SIGSTOP)  # it holds the lock but writes nothing meanwhile
        before, config = tree(live), (live / "config.yaml").read_bytes()
        for extra in ("train.max_epochs=20", "train.max_epochs=30"):
            second = run_cli(*args, extra, cwd=tmp_path, env=env, check=False)
            assert second.returncode == 2, second.stdout + second.stderr
            assert f"is in use by another launch (pid {first.pid} on host" in second.stderr
            assert len(second.stderr.strip().splitlines()) == 2 and "Traceback" not in second.stderr
            assert tree(live) == before, "the refused launch changed nothing in the run directory"
        status = run_cli("status", str(live), cwd=tmp_path).stdout
        assert f"training (pid {first.pid} on host" in status
        (live / ".lock").unlink()  # the holder is known no more; the directory is still held
        second = run_cli(*args, "train.max_epochs=20", cwd=tmp_path, env=env, check=False)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is in use by another launch (holder unknown" in second.stderr
        assert not (live / ".lock").exists() and (live / "config.yaml").read_bytes() == config
        assert "training (holder unknown" in run_cli("status", str(live), cwd=tmp_path).stdout
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    relaunch = run_cli(*args, "train.max_epochs=1", cwd=tmp_path, env=cli_env(SLOW_STEP_S="0"))
    assert "resumed from" in relaunch.stdout
    assert json.loads((live / "result.json").read_text())["status"] == "completed"


def test_a_launch_that_made_the_folder_but_lost_the_lock_leaves_the_winners_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Launch A makes run.dir; before A takes the lock, launch B (a real process) takes it and
    starts training there. A is refused and removes nothing: B's lock file, config and folder
    stay, and B trains to the end."""
    (tmp_path / "slow.yml").write_text(TINY + "imports: [faulty]\n")
    overrides = ["train.step=slow", "run.dir=r", "train.max_steps=6"]
    monkeypatch.chdir(tmp_path)
    cfg = compose.compose("slow.yml", overrides)
    real_lock, winner = rundir._lock, []

    def after_b_holds_it(path: Path, *made_dir: bool) -> rundir.RunLock:
        b = subprocess.Popen(
            [sys.executable, "-m", "expctl", "run", "-C", "slow.yml", *overrides],
            cwd=tmp_path,
            env=cli_env(SLOW_STEP_S="0.3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        winner.append(b)
        deadline = time.time() + 120
        while not (path / "config.yaml").exists() and b.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        return real_lock(path, *made_dir)

    monkeypatch.setattr(rundir, "_lock", after_b_holds_it)
    with pytest.raises(UserError) as e:
        rundir.create(cfg)
    (b,) = winner
    try:
        assert "is in use by another launch" in e.value.message
        assert json.loads((tmp_path / "r" / ".lock").read_text())["pid"] == b.pid
        out, _ = b.communicate(timeout=300)
    finally:
        b.kill()
    assert b.returncode == 0, out
    assert json.loads((tmp_path / "r" / "result.json").read_text())["step"] == 6


def test_a_directory_holding_only_bookkeeping_is_free_to_use(tiny: Path) -> None:
    """A Slurm trial that failed before training leaves its lock and jobs.jsonl: its retry
    (sweep resume) writes its config there."""
    d = tiny.parent / "retry"
    d.mkdir()
    (d / ".lock").write_text("")
    (d / "jobs.jsonl").write_text('{"job_id": "1", "event": "submitted"}\n')
    cfg, held = rundir.create(frozen(tiny, d))
    assert held is not None and (d / "config.yaml").is_file()
    held.release()


def test_a_user_error_in_local_workers_is_said_once(tiny: Path) -> None:
    """Both workers find the checkpoint of another model unusable; rank 0 says so, once."""
    run_cli("run", "-C", str(tiny), "train.max_steps=2", "run.dir=a", cwd=tiny.parent)
    ckpt = retention.list_checkpoints(tiny.parent / "a")[0]
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "model.hidden=[16]",
        f"checkpoint.resume={ckpt}",
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=b",
        cwd=tiny.parent,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("expctl: error:") == 1, proc.stderr
    assert "its model 'model' does not match" in proc.stderr
    assert not (tiny.parent / "b").exists()


def test_atomic_file_replaces_a_file_whole_or_leaves_it_as_it_was(tmp_path: Path) -> None:
    """The one atomic writer (`atomic.atomic_file`): a reader sees the old file until the block
    ends, a block that fails leaves the old file and no temporary one, and the new file gets the
    mode asked for (less the umask)."""
    import stat

    from expctl import atomic

    target = tmp_path / "result.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic.atomic_file(target) as f:
        f.write(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n" and list(tmp_path.iterdir()) == [target]
    with atomic.atomic_file(target, 0o640) as f:
        f.write(b"new\n")
        assert target.read_text() == "old\n"
        assert atomic.temporaries(tmp_path, target.name) == [Path(f.name)]
    umask = os.umask(0)
    os.umask(umask)
    assert target.read_text() == "new\n" and atomic.temporaries(tmp_path) == []
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 & ~umask
