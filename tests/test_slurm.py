"""Against the real local Slurm cluster (../shared/slurm-local): srun, sbatch templates,
launcher=slurm through submitit, every requeue path, fail-fast layouts, two jobs at once."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, SNAPMOD, TINY, cli_env, tree, user_repo
from conftest import expctl as run_cli

# one cluster of 2 nodes x 4 CPUs (.ci/setup): its tests run in a few xdist groups, each one test
# after another in one worker, whose jobs fit on it side by side (at most 8 CPUs at once, so that
# none waits for another's): "slurm" (jobs of up to 4 CPUs: two jobs at once, arrays, PBT),
# "slurm-requeue" (the 2-CPU jobs that requeue), "slurm-timelimit" (2), "slurm-light" (none)
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("slurm")]
CLUSTER_CPUS = 8
EXPCTL = str(Path(sys.executable).parent / "expctl")
SLOW = TINY + "imports: [faulty]\ncheckpoint: {every: 10}\n"


@pytest.fixture(scope="module", autouse=True)
def cluster() -> None:
    conf = os.environ.get("SLURM_CONF", "/tmp/expctl-slurm/etc/slurm.conf")
    ok = shutil.which("sinfo") and Path(conf).is_file()
    if ok:
        os.environ["SLURM_CONF"] = conf
        ok = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    if not ok:
        if os.environ.get("EXPCTL_REQUIRE_SLURM") == "1":
            pytest.fail("the local Slurm cluster is not running (../shared/slurm-local/start.sh)")
        pytest.skip("no local Slurm cluster")
    cpus = subprocess.run(
        ["sinfo", "-h", "-o", "%C"], capture_output=True, text=True, timeout=30
    ).stdout.split("/")[-1]
    if os.environ.get("PYTEST_XDIST_WORKER") and int(cpus or 0) < CLUSTER_CPUS:
        # the groups' jobs would queue behind each other's: PBT's trials must run at once
        pytest.fail(
            f"the local Slurm cluster has {cpus} CPUs; tests in parallel need {CLUSTER_CPUS}: "
            "restart it with `bash .ci/setup --test` (SLURM_LOCAL_CPUS=4), or run with -n 0"
        )


def env(**extra: str) -> dict[str, str]:
    return cli_env(EXPCTL=EXPCTL, **extra)


def sbatch(args: list[str], cwd: Path, **extra: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", *args],
        cwd=cwd,
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip().split(";")[0]


def state(job: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"], capture_output=True, text=True
    )
    lines = out.stdout.split()
    return lines[-1] if lines else "UNKNOWN"


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_done(job: str, timeout: float = 240) -> str:
    final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    wait_until(lambda: state(job) in final, timeout, f"job {job} to end")
    return state(job)


def last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    return json.loads(lines[-1])["step"] if lines else 0


def starts(run_dir: Path) -> list[dict[str, object]]:
    lines = (run_dir / "jobs.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "started"]


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the cluster's nodes share this filesystem; keep files readable by every daemon
    path = tmp_path_factory.mktemp("slurm")
    (path / "tiny.yml").write_text(TINY)
    (path / "slow.yml").write_text(SLOW)
    return path


def result(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "result.json").read_text())


def test_srun_two_nodes_matches_one_process_with_twice_the_batch(work: Path) -> None:
    """2 tasks x batch 32 on two nodes train what one process does with batch 64 (the same
    tolerance as local DDP against one process, tests/test_train.py; one warm process here
    instead of two fresh workers on the serial Slurm path)."""
    proc = subprocess.run(
        ["srun", "-N", "2", "--ntasks-per-node=1", EXPCTL, "run", "-C", "tiny.yml"],
        cwd=work,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((work / "runs").iterdir())
    assert re.fullmatch(r"mlp-synthetic-job\d+", run_dir.name), "named from the job id"
    log = (run_dir / "train.log").read_text()
    assert "slurm x 2 rank(s)" in log and "via node1:" in log
    run_cli("run", "-C", "tiny.yml", "data.batch_size=64", "run.dir=single", cwd=work)
    a, b = result(run_dir), result(work / "single")
    assert a["step"] == b["step"] == 2 * 512 // 64
    assert a["val/acc"] == pytest.approx(b["val/acc"], abs=1e-6)
    assert a["val/loss"] == pytest.approx(b["val/loss"], rel=1e-4)


def test_srun_two_nodes_two_tasks_each(work: Path) -> None:
    proc = subprocess.run(
        ["srun", "-N", "2", "--ntasks-per-node=2", EXPCTL, "run", "-C", "tiny.yml"],
        cwd=work,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = list((work / "runs").iterdir())
    assert "slurm x 4 rank(s)" in (run_dir / "train.log").read_text()
    assert result(run_dir)["step"] == 2 * 512 // (4 * 32)
    assert len(list(run_dir.glob("*.jsonl"))) == 2, "only rank 0 writes (metrics + jobs)"


def test_batch_shell_without_srun_is_one_process(work: Path) -> None:
    job = sbatch(
        [
            "-N",
            "2",
            "--ntasks-per-node=2",
            "--output=batch.out",
            "--wrap",
            f"{EXPCTL} run -C tiny.yml",
        ],
        work,
    )
    assert wait_done(job) == "COMPLETED", (work / "batch.out").read_text()
    run_dir = work / "runs" / f"mlp-synthetic-job{job}"
    assert "inline x 1 rank(s)" in (run_dir / "train.log").read_text()


def test_launcher_slurm_submits_without_waiting_and_completes(work: Path) -> None:
    proc = run_cli(
        "run",
        "-C",
        "tiny.yml",
        "launcher=slurm",
        "launcher.nodes=2",
        "launcher.partition=debug",
        "launcher.timeout_min=5",
        cwd=work,
    )
    job = re.search(r"submitted job (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    run_dir = Path(re.search(r"run directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    assert not (run_dir / "result.json").exists(), "returned before the job finished"
    assert wait_done(job) == "COMPLETED"
    assert result(run_dir)["step"] == 16
    status = run_cli("status", str(run_dir), cwd=work).stdout
    assert (
        f"job       {job}  COMPLETED" in status and "requeued 0x" in status and "val/acc=" in status
    )


def _signal_when_running(
    job: str, run_dir: Path, act: Callable[[], None], at_step: int = 20
) -> None:
    wait_until(lambda: last_step(run_dir) >= at_step, 120, f"job {job} to reach step {at_step}")
    act()


def _submit_slow(work: Path) -> tuple[str, Path]:
    """A 2-node launcher=slurm run of 48 slow steps (0.1 s each): its job id and run directory."""
    proc = run_cli(
        "run",
        "-C",
        "slow.yml",
        "train.step=slow",
        "train.max_epochs=6",
        "launcher=slurm",
        "launcher.nodes=2",
        "launcher.timeout_min=5",
        cwd=work,
        env=env(SLOW_STEP_S="0.1"),
    )
    job = re.search(r"submitted job (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    return job, Path(re.search(r"run directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]


@pytest.mark.xdist_group("slurm-requeue")
def test_launcher_slurm_preempted_by_signal_requeues_through_submitit(work: Path) -> None:
    job, run_dir = _submit_slow(work)
    _signal_when_running(
        job, run_dir, lambda: subprocess.run(["scancel", "--signal=USR2", job], check=True)
    )
    assert wait_done(job) == "COMPLETED"
    assert result(run_dir)["step"] == 6 * 8
    assert [s["restart"] for s in starts(run_dir)] == [0, 1]
    assert "resumed from" in (run_dir / "train.log").read_text()


def _template_job(
    work: Path, name: str, *extra: str, sbatch_args: tuple[str, ...] = (), **env_extra: str
) -> tuple[str, Path]:
    job = sbatch(
        [
            *sbatch_args,
            f"--output={name}.out",
            str(REPO / "slurm" / "train_cpu.sbatch"),
            "-C",
            "slow.yml",
            "train.step=slow",
            f"run.name={name}",
            *extra,
        ],
        work,
        **{"SLOW_STEP_S": "0.1", **env_extra},
    )
    return job, work / "runs" / f"{name}-job{job}"


@pytest.mark.xdist_group("slurm-requeue")
def test_signal_to_sbatch_job_requeues_and_resumes(work: Path) -> None:
    """USR2 to a running job: it checkpoints, requeues and resumes. Before that, while it trains,
    a second launch on its run directory is refused naming the job, and changes nothing."""
    job, run_dir = _template_job(work, "sig", "train.max_epochs=6")

    def refuse_then_signal() -> None:
        _a_second_launch_is_refused(work, job, run_dir, "sig")
        subprocess.run(["scancel", "--signal=USR2", job], check=True)

    _signal_when_running(job, run_dir, refuse_then_signal)
    assert wait_done(job) == "COMPLETED", (work / "sig.out").read_text()
    assert result(run_dir)["step"] == 6 * 8
    events = [json.loads(x) for x in (run_dir / "jobs.jsonl").read_text().splitlines()]
    stopped = [e for e in events if e["event"] == "stopped"]
    assert len(stopped) == 1 and [s["restart"] for s in starts(run_dir)] == [0, 1]
    assert f"(step {stopped[0]['step']}," in (run_dir / "train.log").read_text(), (
        "resumed the stop checkpoint"
    )


@pytest.mark.xdist_group("slurm-requeue")
def test_scontrol_requeue_resumes_from_last_checkpoint(work: Path) -> None:
    job, run_dir = _template_job(work, "requeue", "train.max_epochs=6")
    _signal_when_running(
        job, run_dir, lambda: subprocess.run(["scontrol", "requeue", job], check=True), at_step=25
    )
    # requeued, not started again (Slurm holds it ~10 s): the count is Slurm's, not 0 until then
    shown = run_cli("status", str(run_dir), cwd=work).stdout
    assert len(starts(run_dir)) == 1 and "requeued 1x" in shown, shown
    assert wait_done(job) == "COMPLETED", (work / "requeue.out").read_text()
    assert result(run_dir)["step"] == 6 * 8
    log = (run_dir / "train.log").read_text()
    resumed = int(re.search(r"resumed from .* \(step (\d+),", log).group(1))  # type: ignore[union-attr]
    assert resumed >= 20, "lost at most one checkpoint interval (10 steps)"


def _tasks(job: str, program: bytes) -> dict[int, list[int]]:
    """The processes of the tasks of `job`'s first step that run `program`, by rank: the task's
    own process first, then those it forked (data workers)."""
    found: dict[int, int] = {}  # pid: rank
    parents: dict[int, int] = {}
    for pid in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (OSError, ValueError):
            continue
        if (
            f"SLURM_JOB_ID={job}".encode() in environ
            and b"SLURM_STEP_ID=0" in environ
            and program in cmd
            and not cmd.startswith(b"srun")
        ):
            found[int(pid)] = next(int(v[13:]) for v in environ if v.startswith(b"SLURM_PROCID="))
            parents[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
    ranks: dict[int, list[int]] = {}
    for pid in sorted(found, key=lambda p: parents[p] in found):  # tasks' own processes first
        ranks.setdefault(found[pid], []).append(pid)
    return ranks


def _kill_task(job: str, rank: int, program: bytes) -> None:
    """SIGKILL the process of task `rank` of `job`'s first step that runs `program`."""
    pids = _tasks(job, program).get(rank)
    assert pids, f"rank {rank} of job {job} not found"
    os.kill(pids[0], signal.SIGKILL)


def _a_second_launch_is_refused(work: Path, job: str, run_dir: Path, name: str) -> None:
    """While `job` trains `run_dir` (its tasks stopped meanwhile, so that they write nothing),
    the same run launched here exits 2 naming the job that holds the run, and leaves the run
    directory as it was."""
    ranks = _tasks(job, b"expctl")
    assert sorted(ranks) == [0, 1], ranks
    pids = [pid for rank in ranks.values() for pid in rank]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        before = tree(run_dir)
        args = ["-C", "slow.yml", "train.step=slow", f"run.name={name}", "train.max_epochs=6"]
        proc = run_cli("run", *args, f"run.dir={run_dir}", cwd=work, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"is in use by another launch (pid {ranks[0][0]} on host" in proc.stderr, proc.stderr
        assert f", Slurm job {job}, since " in proc.stderr, proc.stderr
        assert tree(run_dir) == before, "the refused launch changed nothing in the run directory"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.xdist_group("slurm-requeue")
def test_sigkill_of_one_task_requeues_the_job(work: Path) -> None:
    job, run_dir = _template_job(work, "killed", "train.max_epochs=6")
    _signal_when_running(job, run_dir, lambda: _kill_task(job, 1, b"expctl"))
    assert wait_done(job) == "COMPLETED", (work / "killed.out").read_text()
    assert result(run_dir)["step"] == 6 * 8
    assert [s["restart"] for s in starts(run_dir)] == [0, 1]


@pytest.mark.xdist_group("slurm-requeue")
def test_launcher_slurm_requeues_when_a_task_is_killed(work: Path) -> None:
    job, run_dir = _submit_slow(work)
    _signal_when_running(job, run_dir, lambda: _kill_task(job, 1, b"submitit.core._submit"))
    assert wait_done(job) == "COMPLETED", sorted((run_dir / "slurm").glob("*"))
    assert result(run_dir)["step"] == 6 * 8
    assert [s["restart"] for s in starts(run_dir)] == [0, 1]
    events = [json.loads(x) for x in (run_dir / "jobs.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events].count("failed") == 1, events
    assert "resumed from" in (run_dir / "train.log").read_text()


# one task on each node: this 3-minute job (2 CPUs) runs beside the other groups' jobs
@pytest.mark.xdist_group("slurm-timelimit")
def test_time_limit_shorter_than_training_requeues_itself(work: Path) -> None:
    # slurmctld checks time limits every 30 s and sends the timed signal at the first check with at
    # most (delay + 30 s) left: a 3-minute limit with USR2@90 signals 60-90 s into each run, after
    # the tasks have started and set their handlers (a signal before any job step exists is lost;
    # one before the handler kills the task: a start-up of 30 s is seen on a loaded 2-core
    # machine). 96 s of training cannot finish before that signal, so only a requeue can complete
    # it. Once requeued, steps take 0.02 s: the rest fits before the next signal (two runs, not
    # three or four of ~40 s of start-up and requeue delay each on a loaded machine).
    job, run_dir = _template_job(
        work,
        "timelimit",
        "train.max_epochs=16",
        "launcher.max_requeues=10",
        sbatch_args=("--time=3", "--signal=USR2@90"),
        SLOW_STEP_S="0.75",
        SLOW_STEP_S_REQUEUED="0.02",
        EXPCTL_MAX_REQUEUES="10",
    )
    assert wait_done(job, timeout=900) == "COMPLETED", (work / "timelimit.out").read_text()
    assert result(run_dir)["step"] == 16 * 8
    events = [json.loads(x) for x in (run_dir / "jobs.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e["event"] == "stopped"], "stopped by the timed signal"
    assert len(starts(run_dir)) >= 2


def test_two_jobs_at_once_never_share_port_or_directory(work: Path) -> None:
    jobs = [
        sbatch(
            [
                "-N",
                "2",
                "--ntasks-per-node=1",
                f"--output=two{i}.out",
                "--wrap",
                f"srun {EXPCTL} run -C slow.yml train.step=slow",
            ],
            work,
            SLOW_STEP_S="0.05",
        )
        for i in range(2)
    ]
    dirs = [work / "runs" / f"mlp-synthetic-job{j}" for j in jobs]
    wait_until(lambda: all(last_step(d) > 0 for d in dirs), 120, "both jobs running at once")
    assert all(wait_done(j) == "COMPLETED" for j in jobs)
    ports = [re.search(r"via node1:(\d+)", (d / "train.log").read_text()).group(1) for d in dirs]  # type: ignore[union-attr]
    assert ports[0] != ports[1] and all(result(d)["step"] == 16 for d in dirs)


def _fake_rank(rank: int, **extra: str) -> dict[str, str]:
    return env(
        SLURM_JOB_ID="424242",
        SLURM_STEP_ID="0",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="node1",
        SLURM_STEP_TASKS_PER_NODE="2",
        **extra,
    )


# a Slurm environment without a job: needs no cluster time, so off the serial group
@pytest.mark.xdist_group("slurm-light")
def test_master_that_never_appears_fails_within_the_rendezvous_timeout(work: Path) -> None:
    t0 = time.time()
    proc = run_cli(
        "run", "-C", "tiny.yml", "launcher.rdzv_timeout=5", cwd=work, env=_fake_rank(1), check=False
    )
    took = time.time() - t0
    print(f"fail-fast: master never appears -> exit after {took:.1f} s")
    assert (
        proc.returncode == 2 and "could not reach rank 0" in proc.stderr and "HINT" in proc.stderr
    )
    assert took < 60


@pytest.mark.xdist_group("slurm-requeue")
def test_port_already_taken_fails_fast_on_srun(work: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.time()
        proc = subprocess.run(
            [
                "srun",
                "-N",
                "2",
                "--ntasks-per-node=1",
                f"--export=ALL,MASTER_PORT={port}",
                EXPCTL,
                "run",
                "-C",
                "tiny.yml",
                "launcher.rdzv_timeout=5",
            ],
            cwd=work,
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.time() - t0
    print(f"fail-fast: port taken -> srun ended after {took:.1f} s")
    assert proc.returncode != 0 and f"cannot listen on node1:{port}" in proc.stderr
    assert "HINT: the port is taken" in proc.stderr and "Traceback" not in proc.stderr
    assert took < 60


def test_sweep_on_slurm_is_a_job_array_and_the_table_follows_it(work: Path) -> None:
    from expctl.sweep import ledger

    proc = run_cli(
        "run",
        "-C",
        "slow.yml",
        "-m",
        "optim.lr=0.01,0.1,0.3",
        "train.step=slow",
        "train.max_epochs=1",
        "launcher=slurm",
        "launcher.nodes=2",
        "launcher.timeout_min=5",
        "sweep.pruner=asha",
        "sweep.max_concurrent=2",
        cwd=work,
        env=env(SLOW_STEP_S="0.05"),
    )
    job = re.search(r"submitted 3 trial\(s\) as job\(s\) (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    scripts = [p.read_text() for p in (sweep / "slurm").glob("*.sh")]
    assert any("#SBATCH --array=0-2%2\n" in text for text in scripts), "max_concurrent: %N"
    early = run_cli("sweep", "table", str(sweep), cwd=work).stdout
    assert re.search(r"(pending|running)", early), early
    wait_until(
        lambda: all(r.status in ("completed", "stopped") for r in ledger.rows(sweep)),
        300,
        "all trials",
    )
    rows = ledger.rows(sweep)
    assert len(rows) == 3
    ids = [
        json.loads((Path(r.run_dir) / "jobs.jsonl").read_text().splitlines()[0])["job_id"]
        for r in rows
    ]
    assert sorted(ids) == [f"{job}_{i}" for i in range(3)], "one array, one element per trial"
    assert all("submitit x 2 rank(s)" in (Path(r.run_dir) / "train.log").read_text() for r in rows)


def test_pbt_on_slurm_a_trial_continues_as_a_copy_inside_its_job(work: Path) -> None:
    """A population of 2 (the grid as written) as a job array: the trial with the poor learning
    rate (slowed to half
    speed, so it reaches epoch 1 second, while the other still runs) continues from the other's
    checkpoint in the same job, with an explored learning rate; both complete."""
    proc = run_cli(
        "run",
        "-C",
        "slow.yml",
        "-m",
        "sched=none",
        "sweep.scheduler=pbt",
        "sweep.pbt.quantile=0.5",
        "sweep.pbt.resample_probability=0",
        "optim.lr=0.0001,0.1",
        "train.step=slow",
        "train.max_epochs=4",
        "launcher=slurm",
        "launcher.timeout_min=5",
        "sweep.max_concurrent=2",
        cwd=work,
        env=env(SLOW_STEP_S="0.15", SLOW_LR_BELOW="0.001"),
    )
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    table = lambda: json.loads(run_cli("sweep", "table", "--json", str(sweep), cwd=work).stdout)  # noqa: E731
    wait_until(
        lambda: all(t["status"] in ("completed", "failed") for t in table()["trials"]),
        300,
        "both trials",
    )
    trials = {t["trial"]: t for t in table()["trials"]}
    assert [trials[n]["status"] for n in (0, 1)] == ["completed", "completed"], trials
    (copy, *_) = trials[0]["lineage"]
    assert copy["from_trial"] == 1 and 0 < copy["step"] < 64, copy  # the donor's newest checkpoint
    # trial 1's value, explored: a listed value moves to its neighbour or stays at the list's end
    assert copy["params"] in ({"optim.lr": 0.1}, {"optim.lr": 0.0001}), copy
    assert trials[1]["lineage"] == [], "the better trial never copies"
    run_dir = sweep / "trial_000"
    began = starts(run_dir)  # one per training: the first, then each copy's
    assert len(began) == 1 + len(trials[0]["lineage"]), began
    assert {(e["job_id"], e["restart"]) for e in began} == {(began[0]["job_id"], 0)}, (
        "the copies went on inside the job: no requeue, no new job"
    )
    assert result(run_dir)["step"] == 64


def test_many_trials_in_one_sweep_lose_none(work: Path) -> None:
    """N short trials as one Slurm job array: every one ends completed, stopped or failed with its
    reason (CI runs 8, two waves of 4 (the array's throttle), beside the other groups' jobs;
    EXPCTL_LOAD_TRIALS=200 runs the full load, ~10 min on 2 cores)."""
    from expctl.sweep import ledger

    n = int(os.environ.get("EXPCTL_LOAD_TRIALS", "8"))
    proc = run_cli(
        "run",
        "-C",
        "tiny.yml",
        "-m",
        f"train.seed=range(0,{n})",
        "train.max_steps=2",
        "launcher=slurm",
        "launcher.timeout_min=5",
        "sweep.max_concurrent=4",
        cwd=work,
        timeout=600,
    )
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    done = ("completed", "stopped", "failed")
    wait_until(
        lambda: all(r.status in done for r in ledger.rows(sweep)), 60 + 15 * n, f"{n} trials"
    )
    rows = ledger.rows(sweep)
    assert len(rows) == n and len({r.run_dir for r in rows}) == n
    assert all(r.status == "completed" or (r.status == "failed" and r.error) for r in rows)
    print(f"load: {n} trials, {sum(r.status == 'completed' for r in rows)} completed, none lost")


def test_a_queued_job_runs_the_code_submitted_not_the_code_on_disk(work: Path) -> None:
    """Two jobs of a module in a git repository wait (held) while the module is edited: the one
    with a snapshot (launcher.snapshot=auto) trains the submitted version, the other the edit."""
    repo = user_repo(work / "repo")
    jobs: dict[str, str] = {}
    for choice in ("auto", "none"):
        proc = run_cli(
            "run",
            "-C",
            "repo/tiny.yml",
            "train.max_epochs=1",
            "launcher=slurm",
            "launcher.timeout_min=5",
            f"launcher.snapshot={choice}",
            "+launcher.sbatch.hold=true",
            f"run.dir=snap_{choice}",
            cwd=work,
        )
        jobs[choice] = re.search(r"submitted job (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    (repo / "snapmod.py").write_text(SNAPMOD.format(version=2))
    subprocess.run(["scontrol", "release", *jobs.values()], check=True, timeout=60)
    assert [wait_done(job) for job in jobs.values()] == ["COMPLETED", "COMPLETED"]
    assert "snapmod version 1" in (work / "snap_auto" / "train.log").read_text()
    assert "snapmod version 2" in (work / "snap_none" / "train.log").read_text()
    (launch,) = json.loads((work / "snap_auto" / "provenance.json").read_text())["launches"]
    shot = launch["snapshot"]
    assert shot["mode"] == "git" and Path(shot["dir"]).parent == work / "snap_auto" / "code"
    assert launch["git"]["dirty"] is False, "the repository as it was when the job was submitted"
    assert launch["attempts"][0]["slurm"] == {"job_id": jobs["auto"]}
    (other,) = json.loads((work / "snap_none" / "provenance.json").read_text())["launches"]
    assert other["snapshot"] is None and not (work / "snap_none" / "code").exists()


@pytest.fixture
def sbatch_calls(work: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `sbatch` records each call in the file returned, then runs the real
    sbatch."""
    real, shim, calls = shutil.which("sbatch"), work / "shim", work / "sbatch_calls"
    assert real is not None
    shim.mkdir()
    (shim / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    (shim / "sbatch").chmod(0o755)
    path = f"{shim}{os.pathsep}{os.environ['PATH']}"
    assert shutil.which("sbatch", path=path) == str(shim / "sbatch")
    return env(PATH=path), calls


# a held job at most (no CPU taken, nothing run): beside the serial group
@pytest.mark.xdist_group("slurm-light")
@pytest.mark.parametrize(
    "hostile",
    [
        "launcher.partition='a;b'",
        "launcher.job_name='$(touch pwned)'",
        "+launcher.sbatch.comment='a`id`'",
        None,  # a control: the same launch without it reaches sbatch
    ],
)
def test_hostile_values_never_reach_sbatch(
    hostile: str | None, work: Path, sbatch_calls: tuple[dict[str, str], Path]
) -> None:
    """A hostile value for sbatch is refused (exit 2, one error and its hint) before sbatch runs,
    on a cluster that would take the job: the control without it submits one (held, then
    cancelled)."""
    shimmed, calls = sbatch_calls
    args = ["run", "-C", "tiny.yml", "launcher=slurm", "+launcher.sbatch.hold=true", "run.dir=h"]
    proc = run_cli(*args, *([hostile] if hostile else []), cwd=work, env=shimmed, check=False)
    job = re.search(r"submitted job (\d+)", proc.stdout)
    if job:  # held: it never runs
        subprocess.run(["scancel", job.group(1)], check=True, timeout=60)
    if hostile is None:
        assert proc.returncode == 0 and job, proc.stdout + proc.stderr
        assert calls.read_text().count("\n") == 1, "the control reached sbatch, once"
        return
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "sbatch values may only hold" in lines[0], proc.stderr
    assert not calls.exists(), f"sbatch ran: {calls.read_text()}"
    assert not (work / "h").exists() and not (work / "pwned").exists()
