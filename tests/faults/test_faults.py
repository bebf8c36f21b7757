"""Fault injection with real processes: killed workers, kills during checkpoint writes, corrupt
checkpoints, a full disk, NaN losses and a hung rank. Each ends in a completed run or a clear
one-line error, and nothing checkpointed is lost."""

from __future__ import annotations

import json
import os
import queue
import random
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import conftest as base
import pytest
import torch

from expctl.rank import checkpoint, retention

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow

# the suite's small config (tests/conftest.py), with batch 16 and the fault-injecting plugin
TINY = base.TINY.replace("batch_size: 32", "batch_size: 16") + "imports: [faulty]\n"
# streamed data (samples made in `__getitem__`, tests/plugins/faulty.py) read by 2 DataLoader
# workers per rank: 128 samples, 8 a batch (16 steps an epoch inline, 8 with 2 ranks)
STREAMED = TINY.replace(
    "data: {name: synthetic, shape: [20], num_classes: 4, num_samples: 512, val_samples: 128, "
    "batch_size: 16}",
    "data: {name: streamed, num_samples: 128, val_samples: 32, batch_size: 8, num_workers: 2}",
)
assert STREAMED != TINY
LOCAL = ["launcher=local", "launcher.nproc=2", "launcher.max_restarts=3", "+model.dropout=0.2"]
env = base.cli_env


def expctl(
    cwd: Path, *args: str, check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    """`expctl run -C tiny.yml ARGS` in `cwd` (forked warm, or a fresh interpreter when a
    `preexec_fn` must act on it)."""
    kw.setdefault("env", env())
    argv = ["run", "-C", "tiny.yml", *args]
    if "preexec_fn" in kw:
        proc = subprocess.run(
            [sys.executable, "-m", "expctl", *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
            **kw,
        )  # type: ignore[call-overload]
    else:
        proc = base.expctl(*argv, cwd=cwd, env=kw["env"], check=False)  # type: ignore[arg-type]
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def ctrl_c(
    args: list[str], cwd: Path, environ: dict[str, str], what: str, ready: Any, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m expctl ARGS` in its own process group (a terminal's foreground job), SIGINT
    to that group once `ready()` (waited for, described as `what`), then its output. SIGINT is
    reset to its default in the child: from a background job it would come ignored, and an
    ignored signal is inherited."""
    child = subprocess.Popen(
        [sys.executable, "-m", "expctl", *args],
        cwd=cwd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        base.wait_for(what, lambda: ready() or child.poll() is not None, timeout=timeout)
        assert ready(), f"{what}: never came, {child.communicate()}"
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(retention.list_checkpoints(run_dir)[0])["models"]["model"]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    work = tmp_path_factory.mktemp("faults")
    (work / "tiny.yml").write_text(TINY)
    expctl(work, *LOCAL, "train.step=kill_at_step", "checkpoint.every=3", "run.dir=ref", env=env())
    return work, weights(work / "ref")


# (rank, step) of the kill, 32 optimizer steps in all, 16 an epoch, a checkpoint every 3: before
# the first checkpoint, each rank at each position after a checkpoint (step % 3 = 0, 1, 2: rank 0
# at 15, 4, 17; rank 1 at 3, 16, 8), either side of the epoch boundary (16 | 17), near the end.
# Each case costs ~30 s of CPU (4 worker starts). EXPCTL_FAULT_SEEDS=N adds N random kills (a soak).
KILLS = [(0, 2), (1, 3), (0, 4), (1, 8), (0, 15), (1, 16), (0, 17), (1, 31)]
_SOAK = random.Random(0)
KILLS += [
    (_SOAK.randrange(2), _SOAK.randrange(2, 32))
    for _ in range(int(os.environ.get("EXPCTL_FAULT_SEEDS", "0")))
]
KILLS = list(dict.fromkeys(KILLS))  # each (rank, step) once: it names the run directory


@pytest.mark.parametrize(("rank", "step"), KILLS)
def test_sigkill_of_a_worker_at_any_step(
    rank: int, step: int, ddp_reference: tuple[Path, dict[str, torch.Tensor]]
) -> None:
    """2 workers, max_restarts=3: the run completes with bitwise the uninterrupted weights."""
    work, ref = ddp_reference
    seed = f"{rank}_{step}"
    log = work / f"kill{seed}.log"
    proc = expctl(
        work,
        *LOCAL,
        "train.step=kill_at_step",
        "checkpoint.every=3",
        f"run.dir=kill{seed}",
        env=env(KILL_AT_STEP=str(step), KILL_RANK=str(rank), KILL_LOG=str(log)),
    )
    # the kill happened, once; torchrun restarted the workers (it logs the first failure it saw:
    # the killed rank's -9, or its peer's abort when both died within one poll)
    assert log.read_text() == f"rank {rank} step {step}\n", f"rank {rank} not killed at {step}"
    assert "failed (exitcode: -" in proc.stderr, proc.stderr[-2000:]
    if step > 3:  # a checkpoint existed (every 3 steps): the restart resumed it
        assert "resumed from" in proc.stdout, f"rank {rank} killed at step {step} did not resume"
    got = weights(work / f"kill{seed}")
    assert all(torch.equal(got[k], ref[k]) for k in ref), f"rank {rank} killed at step {step}"


# 12 steps, a checkpoint every 4: the write of step 8 is killed, step 4's is the one to resume
WRITE_RUN = ["train.step=stall_checkpoint_write", "train.max_steps=12", "checkpoint.every=4"]


# ... and the same with the model sharded over 2 local workers: its checkpoint a folder of their
# shards, the stall in rank 0's write of the rest of the payload, after every shard is written
SHARDED = ["train.strategy=fsdp", "launcher=local", "launcher.nproc=2"]


@pytest.fixture(scope="module")
def write_reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The weights of WRITE_RUN trained without a kill, by strategy (made when first asked)."""
    work = tmp_path_factory.mktemp("write_ref")
    (work / "tiny.yml").write_text(TINY)
    made: dict[str, dict[str, torch.Tensor]] = {}

    def reference(strategy: str) -> dict[str, torch.Tensor]:
        if strategy not in made:
            extra = SHARDED if strategy == "fsdp" else []
            expctl(work, *WRITE_RUN, *extra, f"run.dir=ref_{strategy}")
            made[strategy] = weights(work / f"ref_{strategy}")
        return made[strategy]

    return reference


@pytest.mark.parametrize(("where", "strategy"), [("mid", "ddp"), ("end", "ddp"), ("mid", "fsdp")])
def test_sigkill_inside_a_checkpoint_write_keeps_the_previous_one_and_resumes(
    where: str, strategy: str, tmp_path: Path, write_reference: Any
) -> None:
    """SIGKILL of a run while it writes the checkpoint of step 8, stalled there by the test plugin
    (`mid`: inside torch.save, its first bytes in the file; `end`: the payload whole, before it
    is synced and named): step 4's checkpoint stays the newest and intact, nothing has step 8's
    name, and the relaunch resumes from step 4 to the uninterrupted weights, bitwise. Sharded
    (fsdp, 2 workers): the killed write is a hidden folder with both ranks' shards in it."""
    (tmp_path / "tiny.yml").write_text(TINY)
    marker = tmp_path / "stalled.json"
    run = tmp_path / "w"
    args = [*WRITE_RUN, *(SHARDED if strategy == "fsdp" else []), "run.dir=w"]
    stall = env(STALL_AT_STEP="8", STALL_WHERE=where, STALL_MARKER=str(marker))
    with base.expctl_started("run", "-C", "tiny.yml", *args, cwd=tmp_path, env=stall) as child:
        base.wait_for(
            "the stall", lambda: marker.exists() or not Path(f"/proc/{child.pid}").exists()
        )
        assert marker.exists(), f"never stalled in the write: {child.wait()}"
        os.kill(child.pid, signal.SIGKILL)  # local workers die with their launcher
        killed = child.wait()
    assert killed.returncode == -signal.SIGKILL, killed
    base.wait_for("the workers to end", lambda: not base.workers_of(run))
    stalled = json.loads(marker.read_text())
    partial = Path(stalled["file"])
    previous = checkpoint.path_for(run, 4, shards=strategy == "fsdp")
    if strategy == "fsdp":
        folder = partial.parent
        assert folder.parent == previous.parent and partial.name == "extra.pt"
        assert folder.name.startswith(".step_000000008.dcp.tmp-")
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= {f.name for f in folder.iterdir()}
    else:
        assert partial.parent == previous.parent
        assert partial.name.startswith(".step_000000008.pt.tmp-")
    assert partial.stat().st_size == stalled["bytes"], "killed where it stalled"
    assert retention.list_checkpoints(run) == [previous], "nothing under step 8's name"
    found = checkpoint.resume_point(run)
    assert found is not None and found[0] == previous and found[1]["step"] == 4
    again = expctl(tmp_path, *args)
    assert f"resumed from {previous} (step 4," in again.stdout, again.stdout
    assert not list(previous.parent.glob(".step_*.tmp-*")), "the partial write is cleaned up"
    full = checkpoint.path_for(run, 8, shards=strategy == "fsdp")
    size = (full / "extra.pt" if full.is_dir() else full).stat().st_size  # written whole
    assert (0 < stalled["bytes"] < size) if where == "mid" else stalled["bytes"] == size
    got, ref = weights(run), write_reference(strategy)
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_ctrl_c_inside_a_checkpoint_write_ends_after_it_whole_and_resumes(tmp_path: Path) -> None:
    """Ctrl-C while the checkpoint of step 8 is inside torch.save (held there 2 s by the test
    plugin): the write finishes, then the run stops as a Ctrl-C stops it (exit 130, the command
    that resumes, no traceback: before, the interrupted zip writer raised a RuntimeError), the
    checkpoint of step 8 whole and newest, and the relaunch resumes from it."""
    (tmp_path / "tiny.yml").write_text(TINY)
    marker = tmp_path / "stalled.json"
    stall = env(STALL_AT_STEP="8", STALL_WHERE="mid", STALL_MARKER=str(marker), STALL_SECONDS="2")
    args = ["run", "-C", "tiny.yml", *WRITE_RUN, "run.dir=w"]
    child = ctrl_c(args, tmp_path, stall, "the stall in the write", marker.exists)
    out, err = child.stdout, child.stderr
    assert child.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err, err[-3000:]
    assert "to resume from the last checkpoint" in out + err, (out + err)[-2000:]
    eight = checkpoint.path_for(tmp_path / "w", 8)
    assert retention.list_checkpoints(tmp_path / "w")[0] == eight
    assert checkpoint.load(eight)["step"] == 8  # whole: its checksum verified
    again = expctl(tmp_path, *WRITE_RUN, "run.dir=w")
    assert f"resumed from {eight} (step 8," in again.stdout, again.stdout


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_newest_checkpoint_is_refused_and_set_aside_by_hand(
    damage: str, tmp_path: Path
) -> None:
    """The run does not fall back by itself (the next save would replace the damaged file): exit
    2 naming the intact one; once the damaged files are moved aside, it resumes from it."""
    (tmp_path / "tiny.yml").write_text(TINY)
    expctl(tmp_path, "checkpoint.every=4", "checkpoint.keep=5", "train.max_epochs=1", "run.dir=c")
    newest, previous = retention.list_checkpoints(tmp_path / "c")[:2]
    data = bytearray(newest.read_bytes())
    if damage == "flip":
        for i in range(100, 140):
            data[i] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    newest.write_bytes(bytes(data))
    args = ["checkpoint.every=4", "checkpoint.keep=5", "train.max_epochs=2", "run.dir=c"]
    refused = expctl(tmp_path, *args, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"checksum mismatch for {newest}); the run is not started over" in refused.stderr
    assert f"continue from {previous.name}" in refused.stderr
    for f in newest.parent.glob(f"{newest.name}*"):
        f.rename(tmp_path / f.name)
    proc = expctl(tmp_path, *args)
    assert f"resumed from {previous}" in proc.stdout


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_full_disk_during_a_checkpoint_write(strategy: str, tmp_path: Path) -> None:
    """A first run checkpoints normally (~2.3 MB files); its continuation may not grow a file past
    1 MB (RLIMIT_FSIZE, as a full disk would stop it): a clear one-line error, exit 1, the
    previous checkpoint intact and still the newest, no partial file left. The same for a
    sharded run's folder (DCP's writer fails inside its own threads)."""
    train = f"train: {{max_epochs: 2, log_every: 4, strategy: {strategy}}}"
    big = TINY.replace("hidden: [32]", "hidden: [512, 512]")
    (tmp_path / "tiny.yml").write_text(big.replace("train: {max_epochs: 2, log_every: 4}", train))

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    expctl(tmp_path, "checkpoint.every=4", "train.max_epochs=1", "run.dir=d")
    proc = expctl(
        tmp_path,
        "checkpoint.every=4",
        "train.max_epochs=2",
        "run.dir=d",
        check=False,
        preexec_fn=limit,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert (
        "could not write checkpoint" in lines[-1] and "previous checkpoint is intact" in lines[-1]
    )
    newest = retention.list_checkpoints(tmp_path / "d")[0]
    assert checkpoint.load(newest)["step"] == 32  # the first run's last checkpoint (1 epoch)
    assert not list((tmp_path / "d" / "checkpoints").glob(".*tmp*"))


def test_nan_loss_stops_with_the_step_and_last_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "tiny.yml").write_text(TINY)
    proc = expctl(
        tmp_path,
        "train.step=nan_at_step",
        "train.log_every=1",
        "checkpoint.every=5",
        "run.dir=n",
        check=False,
        env=env(NAN_AT_STEPS="7"),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        "non-finite train/loss by step 7" in proc.stderr
        and "last checkpoint: step_000000005.pt" in proc.stderr
    )


@pytest.mark.parametrize("who", ["every rank", "rank 1 alone"])
def test_a_user_error_in_local_workers_ends_the_output_in_two_lines(
    who: str, tmp_path: Path
) -> None:
    """The first rank to meet a user error prints it and its hint: once when every rank meets
    it (a non-finite loss), and when rank 1 alone does (a corrupt sample of its shard); neither
    torch's agent's line about a worker that exited with code 2 ("failed (exitcode: 2)
    local_rank: ...") nor the other rank's gloo traceback ("Connection closed by peer")
    follows them."""
    if who == "every rank":
        (tmp_path / "tiny.yml").write_text(TINY)
        fault, said = ["train.step=nan_at_step"], "non-finite train/loss by step "
        faults = env(NAN_AT_STEPS="3")
    else:  # sample 129: the second of the validation set, in rank 1's shard
        (tmp_path / "tiny.yml").write_text(STREAMED)
        fault, said = [], "sample 129 of rank 1 cannot be decoded"
        faults = env(BAD_AT_SAMPLE="1:129")
    proc = expctl(
        tmp_path,
        "launcher=local",
        "launcher.nproc=2",
        "train.device=cpu",
        *fault,
        "run.dir=n",
        check=False,
        env=faults,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("expctl: error:")]
    assert len(errors) == 1 and errors[0].startswith(f"expctl: error: {said}"), proc.stderr
    last = proc.stderr.strip().splitlines()[-2:]
    assert last[0] == errors[0] and last[1].startswith("  HINT: "), proc.stderr
    assert "exitcode" not in proc.stderr and "Connection closed" not in proc.stderr


def test_out_of_gpu_memory_ends_the_run_in_one_line_with_what_to_change(tmp_path: Path) -> None:
    """torch's out-of-memory error on both ranks (raised by the step: the CPU has no CUDA
    allocator to fill): one line from the first rank, no traceback, what it tried to allocate,
    and under ddp the strategy that shards; exit 1, the run directory kept."""
    (tmp_path / "tiny.yml").write_text(TINY)
    proc = expctl(
        tmp_path, *LOCAL[:2], "train.step=oom_at_step", "run.dir=o", check=False,
        env=env(OOM_AT_STEP="3"),
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("expctl: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "out of GPU memory near step 3: Tried to allocate 192.00 MiB." in errors[0]
    assert "train.strategy=fsdp" in errors[0] and "Including non-PyTorch" not in errors[0]
    assert "exitcode" not in proc.stderr and (tmp_path / "o" / "config.yaml").exists()


def test_nan_loss_skip_drops_the_update_and_counts_it(tmp_path: Path) -> None:
    (tmp_path / "tiny.yml").write_text(TINY)
    expctl(
        tmp_path,
        "train.step=nan_at_step",
        "train.on_nan=skip",
        "run.dir=s",
        env=env(NAN_AT_STEPS="7,20"),
    )
    events = [json.loads(x) for x in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert max(e.get("train/skipped", 0) for e in events) == 2.0
    assert all(torch.isfinite(t).all() for t in weights(tmp_path / "s").values())


def test_hung_rank_is_named_within_the_timeout(tmp_path: Path) -> None:
    """SIGSTOP one of 2 workers: the other fails after launcher.collective_timeout, naming it."""
    (tmp_path / "tiny.yml").write_text(TINY)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "expctl",
            "run",
            "-C",
            "tiny.yml",
            "launcher=local",
            "launcher.nproc=2",
            "launcher.collective_timeout=8",
            "train.step=slow",
            "train.max_epochs=20",
            "run.dir=h",
        ],
        cwd=tmp_path,
        env=env(SLOW_STEP_S="0.05"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr or ()])
    reader.start()
    metrics = tmp_path / "h" / "metrics.jsonl"
    seen: list[str] = []
    try:
        base.wait_for("training", lambda: metrics.is_file() and metrics.read_text())
        (worker,) = base.workers_of(tmp_path / "h", rank=1)
        t0 = time.time()
        os.kill(worker, signal.SIGSTOP)
        while not any("stopped responding" in x for x in seen):  # rank 0 names the hung rank
            try:
                seen.append(lines.get(timeout=max(0.0, t0 + 120 - time.time())))
            except queue.Empty:
                raise AssertionError("no rank named in 120 s:\n" + "".join(seen)[-3000:]) from None
        took = time.time() - t0
    finally:  # the stopped worker goes, so the agent need not wait out its grace period
        for pid in base.workers_of(tmp_path / "h", rank=1):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=180)
        reader.join(timeout=60)
    err = "".join(seen) + "".join(lines.queue)
    print(f"hung rank: named {took:.1f} s after SIGSTOP (collective timeout 8 s)")
    assert proc.returncode == 1 and "rank 1 stopped responding" in err, err[-3000:]


@pytest.mark.parametrize("kib", [12, 20, 64])
def test_a_full_disk_ends_the_run_in_one_line_whichever_file_it_hits(
    kib: int, tmp_path: Path
) -> None:
    """The run directory on a tmpfs of `kib` KiB: the first write that finds no space (here
    a log file at 12, the first checkpoint at 20, a later one at 64) ends the run with one
    line and exit 1, no traceback and no "--- Logging error ---"; what was checkpointed loads."""
    with base.tmpfs(tmp_path / "disk", kib) as disk:
        (tmp_path / "tiny.yml").write_text(TINY)
        proc = expctl(
            tmp_path,
            "train.log_every=1",
            "checkpoint.every=4",
            "train.max_epochs=3",
            f"run.dir={disk / 'r'}",
            check=False,
        )
        out = proc.stdout + proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1, out[-2000:]
        assert last.startswith("expctl: error: could not write ") and "No space left" in last
        assert "Traceback" not in out and "Logging error" not in out, out[-2000:]
        for ckpt in retention.list_checkpoints(disk / "r"):
            checkpoint.load(ckpt)
        print(f"{kib} KiB: {last}")


def test_local_workers_die_with_a_killed_launcher_and_the_relaunch_resumes(tmp_path: Path) -> None:
    """SIGKILL of the launcher alone (torch's agent puts workers in sessions of their own): the
    workers end with it, so nothing trains beside the relaunch, which resumes."""
    (tmp_path / "tiny.yml").write_text(TINY)
    run_dir = tmp_path / "orphans"
    args = [*LOCAL, "train.step=slow", "checkpoint.every=2", f"run.dir={run_dir}"]
    slow = env(SLOW_STEP_S="0.2")
    with base.expctl_started("run", "-C", "tiny.yml", *args, cwd=tmp_path, env=slow) as launcher:
        base.wait_for("a checkpoint", lambda: retention.list_checkpoints(run_dir))
        assert len(base.workers_of(run_dir)) == 2
        os.kill(launcher.pid, signal.SIGKILL)  # the launcher alone, not its process group
        assert launcher.wait().returncode == -signal.SIGKILL
    base.wait_for("the orphaned workers to end", lambda: not base.workers_of(run_dir), 20)
    again = expctl(tmp_path, *args, env=env(SLOW_STEP_S="0"))
    assert "resumed from" in again.stdout


def test_data_workers_fork_before_any_thread_and_a_stalled_rank_ends_the_run_in_one_line(
    tmp_path: Path,
) -> None:
    """2 ranks, a validation every 2 steps (DESIGN.md trap 13): every fork of a rank happened
    while no other thread of it ran, so never while the training workers' queue feeders ran
    (tests/plugins/forkprobe.py); and when rank 1's worker never returns a validation batch (the
    4th validation), the run ends after data.timeout with one line naming rank 1, exit 1, not
    after launcher.collective_timeout."""
    (tmp_path / "tiny.yml").write_text(STREAMED)
    forks = tmp_path / "forks.jsonl"
    proc = expctl(
        tmp_path,
        "imports=[faulty,forkprobe]",
        "launcher=local",
        "launcher.nproc=2",
        "launcher.collective_timeout=300",
        "train.val_every_steps=2",
        "data.timeout=3",
        "run.dir=stall",
        check=False,
        env=env(FORK_PROBE=str(forks), STALL_AT_SAMPLE="1:129:4"),
    )
    records = [json.loads(line) for line in forks.read_text().splitlines()]
    assert len(records) == 4, records  # 2 workers for each rank, forked once
    assert all(r["threads"] == [] and r["frames"] == 0 for r in records), records
    said = [line for line in proc.stderr.splitlines() if line.startswith("expctl:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert said == [
        "expctl: error: rank 1: no val batch from its 2 DataLoader worker(s) in data.timeout=3 s: "
        "a worker is stuck in the dataset's __getitem__ (or collate); raise data.timeout if a "
        "batch takes that long"
    ], proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == said[0]


def test_resume_with_data_workers_and_dropout_is_bitwise(tmp_path: Path) -> None:
    """Stopped mid-epoch and continued, a run on streamed data with dropout ends with bitwise
    the weights and momentum of the uninterrupted run (the DataLoader's seed draw took a number
    from torch's generator, which dropout uses, only when its workers started)."""
    (tmp_path / "tiny.yml").write_text(STREAMED)
    args = ["+model.dropout=0.2"]
    expctl(tmp_path, *args, "run.dir=whole")
    expctl(tmp_path, *args, "train.max_steps=11", "run.dir=parts")
    again = expctl(tmp_path, *args, "run.dir=parts")
    assert "resumed from" in again.stdout
    whole, parts = (
        checkpoint.load(retention.list_checkpoints(tmp_path / d)[0]) for d in ("whole", "parts")
    )
    assert whole["step"] == parts["step"] == 32
    for key in ("models", "optimizers"):
        a, b = _tensors(whole[key]), _tensors(parts[key])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), key


def _tensors(tree: object, at: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a nested state dict, by path."""
    if isinstance(tree, torch.Tensor):
        return {at: tree}
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _tensors(sub, f"{at}/{key}").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in _tensors(sub, f"{at}/{i}").items()}
    return {}


@pytest.mark.parametrize("launcher", ["inline", "local", "local_fsdp"])
def test_sigterm_saves_an_agreed_checkpoint_and_the_command_it_prints_resumes(
    launcher: str, tmp_path: Path
) -> None:
    """SIGTERM to `expctl run` alone (as Kubernetes or a spot instance sends it; under
    launcher=local the launcher passes it on to each rank's process group, DataLoader workers
    included, which leave it to their rank): every rank stops at the same step, the checkpoint
    of that step is saved, the last line says how to resume, exit 143; and that command
    resumes. The same with the model sharded over the ranks (each writes its shard)."""
    (tmp_path / "tiny.yml").write_text(STREAMED)
    run_dir = tmp_path / "term"
    ranks = ["launcher=local", "launcher.nproc=2"] if launcher != "inline" else []
    ranks += ["train.strategy=fsdp"] if launcher == "local_fsdp" else []
    args = [*ranks, "train.step=slow", "train.max_epochs=20", f"run.dir={run_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "expctl", "run", "-C", "tiny.yml", *args],
        cwd=tmp_path,
        env=env(SLOW_STEP_S="0.05"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 180
    while not (metrics.is_file() and metrics.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "death signal" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    resume = f"run the same command with run.dir={run_dir} to resume"
    assert last.startswith("expctl: stopped by SIGTERM") and last.endswith(resume), err
    saved = checkpoint.load(retention.list_checkpoints(run_dir)[0])["step"]
    assert 0 < saved < 20 * (16 if launcher == "inline" else 8)
    if launcher == "inline":
        assert f"at step {saved};" in last
    again = expctl(tmp_path, *args, env=env(SLOW_STEP_S="0"))
    assert f"(step {saved}," in again.stdout, again.stdout[-2000:]  # "resumed from ... (step N,"


@pytest.mark.parametrize("launcher", ["inline", "local"])
def test_sigterm_before_training_says_where_the_run_is_and_exits_143(
    launcher: str, tmp_path: Path
) -> None:
    """SIGTERM to `expctl run` once RUN_DIR/config.yaml is written, before training's stop flag
    (inline: the model is being built) or torch's agent (local: the workers are starting) took
    the signal over: its default ended the process with exit -15 and no word. One line now:
    stopped by SIGTERM, where the run is and that nothing can be resumed; exit 143."""
    (tmp_path / "tiny.yml").write_text(TINY)
    run_dir = tmp_path / "early"
    ranks = ["launcher=local", "launcher.nproc=2"] if launcher == "local" else []
    args = ["model=stall_build", "model.seconds=120", f"run.dir={run_dir}", *ranks]
    proc = subprocess.Popen(
        [sys.executable, "-m", "expctl", "run", "-C", "tiny.yml", *args],
        cwd=tmp_path,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        config = run_dir / "config.yaml"
        base.wait_for("config.yaml", lambda: config.is_file() or proc.poll() is not None)
        assert config.is_file(), proc.communicate()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "death signal" not in err, err[-3000:]
    again = f"run the same command with run.dir={run_dir} to start over"
    assert err.strip().splitlines()[-1] == (
        f"expctl: stopped by SIGTERM before its first checkpoint, nothing to resume: {again}"
    ), err[-3000:]
    assert err.count("SIGTERM") == 1, err[-3000:]
    base.wait_for("no orphaned worker", lambda: not base.workers_of(run_dir), 20)


def test_ctrl_c_while_a_sweep_trial_closes_its_data_workers_stops_the_sweep(
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT to the sweep's process group, as a terminal sends it) while trial 0 closes
    its DataLoader workers (a worker writes a marker once its DataLoader tells the workers to
    stop, tests/plugins/faulty.py): the sweep stops there, exit 130, the line that says how to
    resume it; not "Exception ignored ... KeyboardInterrupt" in any output, and no next trial."""
    (tmp_path / "tiny.yml").write_text(STREAMED)
    marker = tmp_path / "closing"
    driver = ctrl_c(
        ["run", "-C", "tiny.yml", "-m", "optim.lr=0.1,0.2"]
        + ["data.val_batch_size=2", "train.limit_val_batches=1", "sweep.max_concurrent=1"]
        + ["train.max_epochs=1", "sweep.metric=train/loss", "sweep.mode=min"],
        tmp_path,
        # sample 130 (the 3rd of the validation set, in its second batch): read ahead, never used
        env(INTERRUPT_AT_SAMPLE="0:130", INTERRUPT_MARKER=str(marker)),
        "trial 0 closing its data workers",
        marker.exists,
        timeout=240,
    )
    out, err = driver.stdout, driver.stderr
    assert driver.returncode == 130, err[-3000:]
    (trial,) = tmp_path.glob("runs/sweep-*/trial_000")
    logs = err + (trial / "output.log").read_text()
    assert "Exception ignored" not in logs and "Traceback" not in logs, logs[-3000:]
    assert "to resume from the last checkpoint: expctl sweep resume " in out + err
    assert "trial 1 started" not in out, "the sweep went on"


@pytest.mark.skipif(
    not os.environ.get("EXPCTL_DATA_SOAK"), reason="a soak: EXPCTL_DATA_SOAK=N validations"
)
def test_soak_validations_on_streamed_data_with_several_workers(tmp_path: Path) -> None:
    """EXPCTL_DATA_SOAK=N: 2 ranks with 4 DataLoader workers each validate after each of N
    steps; the run completes (a hung worker would end it after data.timeout, a hung collective
    after launcher.collective_timeout), and no rank forked while another of its threads ran."""
    n = int(os.environ["EXPCTL_DATA_SOAK"])
    (tmp_path / "tiny.yml").write_text(STREAMED)
    forks = tmp_path / "forks.jsonl"
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "expctl", "run", "-C", "tiny.yml", "imports=[faulty,forkprobe]"]
        + ["launcher=local", "launcher.nproc=2", "launcher.collective_timeout=120"]
        + ["data.num_workers=4", "data.timeout=60", "train.val_every_steps=1"]
        + ["train.max_epochs=100000", f"train.max_steps={n}", "train.log_every=50"]
        + ["run.dir=soak"],
        cwd=tmp_path,
        env=env(FORK_PROBE=str(forks)),
        capture_output=True,
        text=True,
        timeout=60 + 10 * n,
    )
    print(f"soak: {n} validations in {time.time() - t0:.0f} s, exit {proc.returncode}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in forks.read_text().splitlines()]
    assert len(records) == 8 and all(r["threads"] == [] for r in records), records
    rows = (tmp_path / "soak" / "metrics.jsonl").read_text().splitlines()
    assert sum('"val/loss"' in r for r in rows) >= n
