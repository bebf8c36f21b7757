"""What Slurm says of jobs (squeue for live ones, sacct for ended ones): the read side of the
Slurm client, which `expctl status` and `expctl sweep table` use without torch or submitit."""

from __future__ import annotations

import re
import subprocess


def job_state(job_id: str) -> dict[str, str]:
    """State and nodes of a job, from squeue (live) or sacct (finished); UNKNOWN if neither says."""
    return job_states([job_id])[job_id]


def job_states(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """Like `job_state` for many jobs, with one squeue and at most one sacct call."""
    out: dict[str, dict[str, str]] = {}
    q = subprocess.run(
        ["squeue", "-h", "--array", "-o", "%i|%T|%N|%r"], capture_output=True, text=True, timeout=60
    )
    if q.returncode == 0:
        for line in q.stdout.splitlines():
            jid, state, nodes, reason = (line.split("|") + ["", "", ""])[:4]
            out[jid.strip()] = {"state": state, "nodes": nodes, "reason": reason}
    missing = [j for j in job_ids if j not in out]
    if missing:
        a = subprocess.run(
            [
                "sacct",
                "-n",
                "-X",
                "-P",
                "-j",
                ",".join(missing),
                "-o",
                "JobID,State,NodeList,ExitCode",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in a.stdout.splitlines():
            jid, state, nodes, code = (line.split("|") + ["", "", ""])[:4]
            if jid in missing:  # the last line of a requeued job is its newest run
                out[jid] = {
                    "state": state.split()[0] if state else "UNKNOWN",
                    "nodes": nodes,
                    "exit_code": code,
                }
    return {j: out.get(j, {"state": "UNKNOWN"}) for j in job_ids}


def restarts(job_id: str) -> int | None:
    """How many times Slurm requeued a job it still knows (scontrol's Restarts), counted at the
    requeue itself, before the job runs again; None when it cannot say."""
    q = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60
    )
    found = re.search(r"\bRestarts=(\d+)", q.stdout) if q.returncode == 0 else None
    return int(found.group(1)) if found else None


FINAL_STATES = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)
