"""Local workers through torch's elastic agent (launcher=local): `start_workers` starts
`launcher.nproc` of them, restarted up to `launcher.max_restarts` times, and says in one line how
they ended (nothing more where a worker printed its own error); each worker ends with its
launcher (`startup.die_with_parent`, in the worker).
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from pathlib import Path

from expctl.config.schema import Config
from expctl.errors import (
    EXIT_FAILED,
    EXIT_PREEMPTED,
    EXIT_TERMINATED,
    EXIT_USER,
    Interrupted,
    Preempted,
    Reported,
    RunError,
)
from expctl.layout import RunDir
from expctl.startup import WORKER_MAIN


def start_workers(cfg: Config, run_dir: Path, args: list[str]) -> None:
    """`launcher.nproc` workers of `python -c WORKER_MAIN _worker RUN_DIR ARGS` through torch's
    elastic agent, restarted up to `launcher.max_restarts` times."""
    # torch's elastic agent (~0.1 s) off inline runs, Slurm tasks and the workers:
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # noqa: PLC0415

    n = cfg.launcher.nproc
    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=n,
        run_id=f"expctl-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"timeout": int(cfg.launcher.rdzv_timeout)},
        max_restarts=cfg.launcher.max_restarts,
        monitor_interval=0.2,
    )
    quiet = _WorkersSpeakForThemselves()
    agent_logs = [logging.getLogger(f"torch.distributed.elastic.{n}") for n in AGENT_LOGS]
    for agent_log in agent_logs:
        agent_log.addFilter(quiet)
    try:
        elastic_launch(lc, sys.executable)("-c", WORKER_MAIN, "_worker", str(run_dir), *args)
    except SignalException as e:  # Ctrl-C or kill: the agent has stopped the workers
        if e.sigval == signal.SIGINT:
            saved = bool(RunDir(run_dir).checkpoint_files())
            raise Interrupted(f"run the same command with run.dir={run_dir}", saved=saved) from None
        if e.sigval == signal.SIGTERM:  # the workers took it as a stop signal, and saved
            raise Preempted(RunDir(run_dir).stopped("SIGTERM"), EXIT_TERMINATED) from None
        raise RunError(f"stopped by {e.sigval.name}; the run is in {run_dir}") from None
    except ChildFailedError as e:
        codes = {rank: failure.exitcode for rank, failure in e.failures.items()}
        raise _failure(codes, cfg.launcher.max_restarts, run_dir) from None
    finally:
        for agent_log in agent_logs:
            agent_log.removeFilter(quiet)


AGENT_LOGS = ("multiprocessing.api", "agent.server.api")
SPOKE = (EXIT_FAILED, EXIT_USER, EXIT_PREEMPTED, EXIT_TERMINATED)  # a worker printed why


def _failure(codes: dict[int, int], restarts: int, run_dir: Path) -> Exception:
    """What the launcher says of failed workers (rank -> exit code): where one printed its
    error (1 or 2), nothing more; where they stopped at a checkpoint, how to resume; else which
    rank died of what, for a worker that could not say it (killed, or the interpreter died)."""
    # the agent sends SIGTERM to the workers left after the first failure: not a cause
    died = {r: c for r, c in codes.items() if c not in (*SPOKE, -signal.SIGTERM)}
    if not died and all(c == -signal.SIGTERM for c in codes.values()):
        died = codes
    if died:
        rank = min(died)
        code = died[rank]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        return RunError(
            f"local worker rank {rank} {how} after {restarts} restart(s); the run is in {run_dir}"
        )
    if all(c in (EXIT_PREEMPTED, EXIT_TERMINATED) for c in codes.values()):
        code = max(codes.values())
        return Preempted(RunDir(run_dir).stopped(_signal_of(code)), code)
    code = EXIT_USER if EXIT_USER in codes.values() else EXIT_FAILED
    return Reported(f"local workers failed (exit code {code}; their error is above)", code)


def _signal_of(code: int) -> str:
    return "SIGTERM" if code == EXIT_TERMINATED else "the stop signal"


class _WorkersSpeakForThemselves(logging.Filter):
    """Drops torch's agent's lines that follow a worker's own words: "failed (exitcode: N)"
    where the worker printed its error or its stop (`SPOKE`: the output ends with its error and
    hint), "Sending process N closing signal SIGTERM" (written after every failure, before the
    agent says why) and "Received N death signal" (a Ctrl-C or SIGTERM that expctl's last line
    names). A worker killed outright keeps the agent's line, and gets expctl's."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        spoke = any(f"(exitcode: {code})" in text for code in SPOKE)
        return not spoke and "closing signal" not in text and "death signal" not in text
