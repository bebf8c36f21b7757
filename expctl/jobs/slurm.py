"""A Slurm client: the sbatch parameters and script of a run, submission through submitit (one
job, or job arrays), `scontrol requeue`, job records (RUN_DIR/jobs.jsonl). What Slurm says of a
job is read in `slurmstate` (torch-free, for `expctl status`).

It knows nothing of training: what a job runs is the callable the launcher hands to `submit`.
Inside a job, ranks are detected from SLURM_* (dist.detect). No config value reaches a shell
unquoted: sbatch values are checked against a strict character set and quoted by submitit.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from expctl.config.schema import Config
from expctl.config.values import check_slurm, tasks_per_node
from expctl.dist import DistEnv
from expctl.errors import RunError, UserError, unknown_name
from expctl.jobs.slurmstate import FINAL_STATES, job_state
from expctl.layout import RunDir, SweepDir

log = logging.getLogger("expctl")


def parameters(cfg: Config) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for `cfg` (checked: nothing can inject shell)."""
    check_slurm(cfg)  # validation did it too; a Config changed by .replace() comes here unchecked
    ln = cfg.launcher
    extra: dict[str, Any] = {str(k).replace("_", "-"): v for k, v in ln.sbatch.items()}
    extra["requeue"] = True
    extra["signal"] = f"{ln.signal}@{ln.signal_delay_s}"
    params: dict[str, Any] = {
        "job_name": ln.job_name or cfg.run.name,
        "nodes": ln.nodes,
        "ntasks_per_node": tasks_per_node(ln),
        "time": ln.timeout_min,
        "signal_delay_s": ln.signal_delay_s,
        "additional_parameters": extra,
        # submitit's own handler listens for SUBMITIT_PREEMPT_SIGNAL; keep it on our signal
        "setup": [f"export SUBMITIT_PREEMPT_SIGNAL={ln.signal}", *ln.setup],
    }
    if ln.gpus_per_node:
        params["gpus_per_node"] = ln.gpus_per_node
    if ln.mem_gb is not None:
        params["mem"] = (
            f"{int(ln.mem_gb)}GB" if ln.mem_gb == int(ln.mem_gb) else f"{int(ln.mem_gb * 1024)}MB"
        )
    for key in ("cpus_per_task", "partition", "account", "qos", "constraint"):
        value = getattr(ln, key)
        if value is not None:
            params[key] = value
    return params


def render(cfg: Config, run_dir: Path) -> str:
    """The exact sbatch script `submit` would hand to sbatch for this run."""
    # submitit off runs not on Slurm (launch imports this module)
    from submitit.slurm.slurm import _make_sbatch_string  # noqa: PLC0415

    folder = RunDir(run_dir).slurm
    command = " ".join(
        [shlex.quote(sys.executable), "-u -m submitit.core._submit", shlex.quote(str(folder))]
    )
    return _make_sbatch_string(command=command, folder=folder, **parameters(cfg))


def check_cluster(cfg: Config) -> None:
    """Fail fast, before anything is written, when Slurm or the partition is missing."""
    if shutil.which("sbatch") is None:
        raise UserError(
            "launcher=slurm but sbatch is not on PATH",
            "run on a Slurm login node, or use launcher=local",
        )
    part = cfg.launcher.partition
    if part is None:
        return
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
    names = [p.rstrip("*") for p in out.stdout.split()]
    if out.returncode == 0 and part not in names:
        raise unknown_name("partition", part, names, "pick one that `sinfo` lists")


def submit(cfg: Config, task: Callable[[], Any]) -> str:
    """Submit the frozen run `cfg` (its run directory exists), each task running `task`;
    return the job id."""
    import submitit  # noqa: PLC0415 - submitit off runs not on Slurm (launch imports this)

    run_dir = Path(str(cfg.run.dir))
    executor = submitit.SlurmExecutor(
        folder=RunDir(run_dir).slurm, max_num_timeout=cfg.launcher.max_requeues
    )
    executor.update_parameters(**parameters(cfg))
    try:
        job = executor.submit(task)
    except Exception as e:  # sbatch refused the job
        text = " ".join(str(e).split())[:300]
        raise UserError(
            f"sbatch refused the job: {text}", "check the launcher.* values (`expctl show`)"
        ) from None
    record_job(run_dir, {"job_id": job.job_id, "event": "submitted"})
    return str(job.job_id)


def submit_array(
    cfgs: list[Config], tasks: Sequence[Callable[[], Any]], sweep_dir: Path
) -> list[str]:
    """Submit frozen runs (sweep trials, each with its task) as job arrays, one per distinct set
    of sbatch values; submitit's files go to SWEEP_DIR/slurm."""
    import submitit  # noqa: PLC0415 - submitit off runs not on Slurm (launch imports this)

    groups: dict[str, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(json.dumps(parameters(cfg), sort_keys=True), []).append(i)
    ids: list[str] = []
    for members in groups.values():
        first = cfgs[members[0]]
        executor = submitit.SlurmExecutor(
            folder=SweepDir(sweep_dir).slurm, max_num_timeout=first.launcher.max_requeues
        )
        executor.update_parameters(**parameters(first))
        if first.sweep.max_concurrent:  # the array's %N throttle: at most N trials at once
            executor.update_parameters(array_parallelism=first.sweep.max_concurrent)
        try:
            with executor.batch():
                jobs = [executor.submit(tasks[i]) for i in members]
        except Exception as e:
            text = " ".join(str(e).split())[:300]
            raise UserError(
                f"sbatch refused the job array: {text}", "check the launcher.* values"
            ) from None
        for i, job in zip(members, jobs, strict=True):
            record_job(Path(str(cfgs[i].run.dir)), {"job_id": job.job_id, "event": "submitted"})
            ids.append(str(job.job_id).split("_")[0])
    return ids


def record_job(run_dir: Path, event: dict[str, Any]) -> None:
    """Append a job event (submission, start, requeue) to RUN_DIR/jobs.jsonl.

    Raises:
        RunError: the write failed (a full disk): one line, the run's checkpoints untouched.
    """
    path = RunDir(run_dir).jobs
    try:
        with open(path, "a") as f:
            f.write(json.dumps({**event, "time": round(time.time(), 3)}) + "\n")
    except OSError as e:
        raise RunError(f"could not write {path} ({e.strerror or e})") from None


def requeue(job_id: str, restart_count: int, max_requeues: int) -> bool:
    """``scontrol requeue`` the job of a plain srun/sbatch run, at most `max_requeues` times."""
    if restart_count >= max_requeues:
        log.warning(
            "not requeuing job %s: already requeued %d time(s) (launcher.max_requeues)",
            job_id,
            restart_count,
        )
        return False
    subprocess.run(["scontrol", "requeue", job_id.split(".")[0]], check=True, timeout=60)
    log.warning(
        "requeued job %s (requeue %d of at most %d)", job_id, restart_count + 1, max_requeues
    )
    return True


def requeue_after_failure(
    env: DistEnv, run_dir: Path, error: BaseException, max_requeues: int
) -> bool:
    """A task of a Slurm job failed for a reason other than a config error (most often a peer
    rank that died: SIGKILL, OOM killer): requeue the job so that it resumes from the newest
    checkpoint, as the sbatch templates do. Every surviving rank asks; Slurm takes the first
    request and refuses the others (the job is already leaving). Bounded by max_requeues."""
    if isinstance(error, UserError) or not env.job_id:
        return False
    if env.restart_count >= max_requeues:
        log.warning(
            "not requeuing job %s: already requeued %d time(s)", env.job_id, env.restart_count
        )
        return False
    text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    if env.is_main:
        record_job(run_dir, {"job_id": env.job_id, "event": "failed", "error": text})
    log.warning("rank %d failed (%s)", env.rank, text)
    # another rank's request may come first: Slurm refuses this one, the job is already leaving
    with contextlib.suppress(subprocess.CalledProcessError):
        requeue(env.job_id, env.restart_count, max_requeues)
    return True


def wait(job_id: str, poll_s: float = 5.0) -> str:
    """Follow a job (through its requeues) until it ends; return its final state."""
    while True:
        state = job_state(job_id)["state"]
        if state in FINAL_STATES:
            return state
        time.sleep(poll_s)
