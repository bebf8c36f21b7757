"""`expctl status RUN_DIR`: what a run is doing, from its files and the Slurm accounting; `state`,
the one word `expctl runs` shows for it, from its files alone."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from expctl.errors import UserError
from expctl.jobs import slurmstate
from expctl.jobs.slurmstate import job_state
from expctl.layout import RunDir, SweepDir
from expctl.rank import rundir

# what a run's files say of it, in one word (`state`)
STATES = (
    "completed",  # result.json: trained to the end of its budget
    "early-stopped",  # completed, ended by train.early_stop
    "stopped",  # a sweep's pruner ended it
    "running",  # a live launch holds its lock
    "submitted",  # a Slurm job was submitted and has not started yet
    "preempted",  # its Slurm job stopped at a checkpoint (the requeued job resumes it)
    "failed",  # its Slurm job recorded an error
    "unfinished",  # no result and no live launch here: failed, killed or on another host
    "not started",  # nothing trained yet
)


def not_a_run_hint(path: Path, otherwise: str) -> str:
    """A sweep's directory is the likely mix-up: its trials are the runs."""
    if (path / SweepDir.SPEC).is_file():
        return f"{path} is a sweep: `expctl sweep table {path}` lists its trials, each a run"
    return otherwise


def status(run_dir: str) -> str:
    """A few lines: job and state, requeues, progress, last metrics, result."""
    path = Path(run_dir)
    run = RunDir(path)
    if not run.is_run():
        raise UserError(
            f"{run_dir}: not a run directory (no {RunDir.CONFIG})",
            not_a_run_hint(path, "pass a folder printed by `expctl run`"),
        )
    lines = [f"run       {path.resolve()}"]
    origin = provenance_line(path)
    if origin:
        lines.append(f"code      {origin}")
    jobs = run.job_events()
    if jobs:
        job_id = str(jobs[-1]["job_id"])
        starts = [j for j in jobs if j.get("event") == "started"]
        restarts = [j.get("restart") for j in starts]
        requeues = max((r for r in restarts if isinstance(r, int)), default=0)
        state = _state(job_id)
        if shutil.which("scontrol") is not None:  # requeued, not yet started again: Slurm knows
            requeues = max(requeues, slurmstate.restarts(job_id) or 0)
        where = f" on {state['nodes']}" if state.get("nodes") else ""
        lines.append(
            f"job       {job_id}  {state['state']}{where}  requeued {requeues}x  ({len(starts)} start(s))"
        )
    else:  # not a Slurm job: the files say what they can
        lines.append(f"state     {_local_state(run)}")
    ckpts = run.checkpoint_files()
    events = [e for e in run.metric_rows() if "step" in e and "epoch" in e]
    if events:
        last = events[-1]
        lines.append(
            f"progress  step {last['step']}, epoch {last['epoch']}"
            + (f"  (checkpoint {ckpts[0].name})" if ckpts else "")
        )
        vals = [e for e in events if any(k.startswith("val/") for k in e)]
        for label, e in (
            (
                "train",
                next((e for e in reversed(events) if any(k.startswith("train/") for k in e)), None),
            ),
            ("val", vals[-1] if vals else None),
        ):
            if e:
                shown = "  ".join(
                    f"{k}={v:.4g}"
                    for k, v in e.items()
                    if k.startswith(f"{label}/") and isinstance(v, float)
                )
                lines.append(f"{label:<9} {shown}  (step {e['step']})")
    else:
        lines.append("progress  not started")
    data = run.read_result()
    if data:
        lines.append(
            "result    "
            + "  ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items()
            )
        )
    return "\n".join(lines)


def state(run: RunDir, result: dict[str, Any]) -> str:
    """One of STATES, from the run's files (`result`: its result.json, read by the caller)."""
    if result:
        status = str(result.get("status", "completed"))
        return "early-stopped" if status == "completed" and result.get("stopped_early") else status
    if rundir.is_locked(run.path):
        return "running"
    jobs = run.job_events()
    event = jobs[-1].get("event") if jobs else None
    if event in ("submitted", "failed"):
        return str(event)
    if event == "stopped":
        return "preempted"
    return "unfinished" if _written(run) else "not started"


def _written(run: RunDir) -> list[Path]:
    return [f for f in (run.metrics, run.log) if f.is_file()]


def _local_state(run: RunDir) -> str:
    """The run's `state`; who trains a running one; the age of the newest write of an
    unfinished one."""
    word = state(run, run.read_result())
    if word == "running":
        return f"training ({rundir.is_locked(run.path) or 'ended just now'})"
    if word != "unfinished":
        return word
    age = time.time() - max(f.stat().st_mtime for f in _written(run))
    return (
        f"unfinished, last written {_age(age)} ago (still running, or interrupted: "
        "the same command resumes it)"
    )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _state(job_id: str) -> dict[str, str]:
    if shutil.which("squeue") is None:
        return {"state": "UNKNOWN (no Slurm client here)"}
    return job_state(job_id)


def provenance_line(run_dir: Path) -> str | None:
    """One line for `expctl status`: the newest launch's commit and dirty flag, and the host of
    its newest attempt (None before the run started training)."""
    launches = RunDir(run_dir).read_provenance().get("launches") or []
    if not launches or not isinstance(launches[-1], dict):
        return None
    last = launches[-1]
    git = last.get("git")
    if not isinstance(git, dict):
        code = "no git repository"
    elif not git.get("commit"):
        code = f"git repository {git.get('root')} without a commit"
    else:
        code = f"git {str(git['commit'])[:12]}" + (
            f" ({git['branch']})" if git.get("branch") else ""
        )
        code += (
            ", dirty" + (f" ({last['diff_file']})" if last.get("diff_file") else "")
            if git.get("dirty")
            else ", clean"
        )
    attempts = last.get("attempts") or [{}]
    host = attempts[-1].get("host", "?") if isinstance(attempts[-1], dict) else "?"
    shot = last.get("snapshot")
    snap = f", code snapshot ({shot.get('mode')})" if isinstance(shot, dict) else ""
    return f"{code}{snap}; on host {host}"
