"""`expctl status RUN_DIR`: what a run is doing, from its files and the Slurm accounting."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from expctl import rundir
from expctl.errors import UserError
from expctl.layout import RunDir
from expctl.slurmstate import job_state


def status(run_dir: str) -> str:
    """A few lines: job and state, requeues, progress, last metrics, result."""
    path = Path(run_dir)
    run = RunDir(path)
    if not run.is_run():
        raise UserError(
            f"{run_dir}: not a run directory (no {RunDir.CONFIG})",
            "pass a folder printed by `expctl run`",
        )
    lines = [f"run       {path.resolve()}"]
    jobs = run.job_events()
    if jobs:
        job_id = str(jobs[-1]["job_id"])
        starts = [j for j in jobs if j.get("event") == "started"]
        restarts = [j.get("restart") for j in starts]
        requeues = max((r for r in restarts if isinstance(r, int)), default=0)
        state = _state(job_id)
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


def _local_state(run: RunDir) -> str:
    """'completed' (or the result's status), else unfinished with the age of the newest write."""
    result = run.read_result()
    if result:
        return str(result.get("status", "completed"))
    holder = rundir.is_locked(run.path)
    if holder:
        return f"training ({holder})"
    files = [f for f in (run.metrics, run.log) if f.is_file()]
    if not files:
        return "not started"
    age = time.time() - max(f.stat().st_mtime for f in files)
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
