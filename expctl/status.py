"""`expctl status RUN_DIR`: what a run is doing, from its files and the Slurm accounting."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from expctl import checkpoint
from expctl.errors import UserError


def _last_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written right now
    return out


def status(run_dir: str) -> str:
    """A few lines: job and state, requeues, progress, last metrics, result."""
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise UserError(
            f"{run_dir}: not a run directory (no config.yaml)",
            "pass a folder printed by `expctl run`",
        )
    lines = [f"run       {path.resolve()}"]
    jobs = _last_lines(path / "jobs.jsonl")
    if jobs:
        job_id = str(jobs[-1]["job_id"])
        starts = [j for j in jobs if j.get("event") == "started"]
        requeues = max((int(j.get("restart", 0)) for j in starts), default=0)
        state = _state(job_id)
        where = f" on {state['nodes']}" if state.get("nodes") else ""
        lines.append(
            f"job       {job_id}  {state['state']}{where}  requeued {requeues}x  ({len(starts)} start(s))"
        )
    else:  # not a Slurm job: the files say what they can
        lines.append(f"state     {_local_state(path)}")
    ckpts = checkpoint.list_checkpoints(path)
    events = _last_lines(path / "metrics.jsonl")
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
    result = path / "result.json"
    if result.is_file():
        data = json.loads(result.read_text())
        lines.append(
            "result    "
            + "  ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items()
            )
        )
    return "\n".join(lines)


def _local_state(path: Path) -> str:
    """'completed' (or the result's status), else unfinished with the age of the newest write."""
    result = path / "result.json"
    if result.is_file():
        return str(json.loads(result.read_text()).get("status", "completed"))
    files = [f for f in (path / "metrics.jsonl", path / "train.log") if f.is_file()]
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
    from expctl.slurm import job_state

    return job_state(job_id)
