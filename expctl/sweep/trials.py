"""A local sweep's trials side by side: each in a process of its own on its share of the machine.

`run_local` keeps as many trials running as the plan (resources.py) allows, starts the next one
as soon as one ends (its share goes to the next), records what a trial could not record itself
(a crash), and shows one line per running trial (board.py) instead of their interleaved logs:
each trial's console output is in TRIAL_DIR/output.log, its log in TRIAL_DIR/train.log.

A Ctrl-C (SIGTERM, or SIGHUP: the terminal closed) stops every running trial at a checkpoint (`interrupted` in the table;
`expctl sweep resume` continues them); a second one kills them (they resume from their last
checkpoint). One failing trial never stops the others, unless `sweep.stop_on_failure`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config.schema import Config, SweepConfig
from expctl.dist import CUDNN_BENCHMARK_ENV
from expctl.errors import (
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    Interrupted,
    RunError,
    UserError,
)
from expctl.jobs.study import (
    SHARE_ENV,
    TrialRef,
    attrs_of,
    finish,
    is_open,
    mark,
)
from expctl.layout import RunDir, SweepDir
from expctl.rank.provenance import Launch
from expctl.sweep import resources
from expctl.sweep.board import Board, placement, write
from expctl.sweep.pool import Pool, Proc
from expctl.sweep.trialprocess import HEADER

log = logging.getLogger("expctl")

STOP = signal.SIGTERM  # a trial's stop: inline and local runs checkpoint and end (exit 3)


@dataclass
class Running:
    """A trial being trained: its number, process, share of the machine and identity."""

    number: int
    proc: Proc
    slot: resources.Slot
    ref: TrialRef
    label: str


def machine(base: Config) -> resources.Machine:
    """This machine as the sweep's trials may use it (no GPU for train.device=cpu)."""
    gpus = 0
    if base.train.device != "cpu":
        import torch  # noqa: PLC0415 - torch off a CPU sweep's driver (it counts GPUs)

        gpus = torch.cuda.device_count()
    return resources.Machine.here(gpus)


def plan_for(base: Config, trials: int) -> resources.Plan:
    s = base.sweep
    ranks = base.launcher.nproc if base.launcher.name == "local" else 1
    return resources.plan(
        machine(base), s.gpus_per_trial, s.cpus_per_trial, s.max_concurrent, trials, ranks
    )


def with_share(cfg: Config, share: resources.Share) -> Config:
    """A trial's config for its share: N whole GPUs make it an N-rank local DDP run."""
    if share.whole > 1:
        return cfg.replace("launcher", name="local", nproc=share.whole)
    return cfg


def run_local(
    sweep_dir: Path,
    plan: resources.Plan,
    todo: Sequence[Any],
    make_config: Callable[[Any], Config],
    origin: Launch,
    settings: SweepConfig,
    pool: Pool | None = None,
) -> None:
    """Run the trials `todo` (each made into a frozen trial config by `make_config`, when it
    starts) side by side as `plan` allows; returns when all ended. `pool`: the trials' forker,
    if one was started early (cli.py starts it first); it is closed here.

    Raises:
        Interrupted: Ctrl-C or SIGTERM stopped the sweep (its trials at a checkpoint).
        RunError: the sweep's journal could not be written (a full disk): trials stopped; or
            the zygote died, its trials with it.
    """
    print(f"expctl: {plan.describe()}", flush=True)
    driver = Driver(sweep_dir, plan, make_config, settings, pool)
    try:
        SweepDir(sweep_dir).launch.write_text(origin.to_json())
        driver.run(deque(todo))
    except OSError as e:  # the journal or a trial's folder: stop, the ledger says what was left
        driver.abort()
        raise RunError(
            f"cannot write the sweep's files in {sweep_dir} ({e.strerror or e}): its running "
            f"trials were stopped; free space, then `expctl sweep resume {sweep_dir}`"
        ) from None
    except RunError as e:  # the zygote died, and the trials with it (nothing left to stop)
        raise RunError(
            f"{e}: `expctl sweep resume {sweep_dir}` resumes them from their checkpoints"
        ) from None
    except UserError as e:  # the next trial could not be made (its folder: a full disk)
        stopped = (
            "the sweep's running trials were stopped" if driver.running else "the sweep stopped"
        )
        driver.abort()
        raise UserError(
            f"{e.message} ({stopped})",
            f"{e.hint + '; then ' if e.hint else ''}`expctl sweep resume {sweep_dir}` continues",
        ) from None
    finally:
        driver.close()
        SweepDir(sweep_dir).launch.unlink(missing_ok=True)
    if driver.stop.reason == "interrupt":  # exits 128 + the signal, as a shell says (Ctrl-C: 130)
        raise Interrupted(f"expctl sweep resume {sweep_dir}", 128 + driver.stop.signum)


# a trial's failure that its sweep's settings caused, alike for every trial (the validation
# of each reports the same metrics)
SWEEP_WIDE = ("UserError: sweep.metric=",)


class Driver:
    """Keeps the plan's trials running until the queue is empty or the sweep is stopped."""

    def __init__(
        self,
        sweep_dir: Path,
        plan: resources.Plan,
        make_config: Callable[[Any], Config],
        settings: SweepConfig,
        pool: Pool | None = None,
    ) -> None:
        self.sweep_dir, self.plan, self.make_config = sweep_dir, plan, make_config
        self.settings = settings
        self.alloc = resources.Allocator(plan)
        self.running: dict[int, Running] = {}
        self.board = Board(sys.stdout, sweep_dir)
        self.stop = _Stop()
        self.pool = pool or Pool()

    def run(self, queue: deque[Any]) -> None:
        """Start trials as their shares free up (a freed share starts the next trial at once;
        a wave of them together) until the queue is empty or the sweep is stopped."""
        with self.stop.catching():
            while self.running or (queue and not self.stop.reason):
                ready = []  # made first, started together
                while queue and not self.stop.reason and (slot := self.alloc.take()):
                    ready.append((self.make_config(queue.popleft()), slot))
                for cfg, slot in ready:
                    self._start(cfg, slot)
                if self.stop.pending():
                    self.pool.signal(STOP if self.stop.count == 1 else signal.SIGKILL)
                for p in self.pool.wait(timeout=self.board.tick):
                    self._ended(self.running.pop(p.pid or 0), p.code or 0)
                self.board.show(self.running.values())

    def _start(self, cfg: Config, slot: resources.Slot) -> None:
        r = _start(
            self.pool, cfg, slot, SweepDir(self.sweep_dir).launch, bool(self.plan.machine.gpus)
        )
        self.running[r.proc.pid or 0] = r
        self.board.started(r)

    def _ended(self, r: Running, code: int) -> None:
        self.alloc.give_back(r.slot)
        failed = _ended(r, code, self.settings, bool(self.stop.reason), self.board)
        if failed and failed.startswith(SWEEP_WIDE) and not self.stop.reason:
            self.stop.ask("failure")  # every trial validates alike: each would fail so
            self.board.say(
                "the sweep's own setting failed the trial (every trial would): stopping the "
                f"sweep; start a new one with it fixed ({self.sweep_dir} keeps what ran)"
            )
        elif failed and self.settings.stop_on_failure and not self.stop.reason:
            self.stop.ask("failure")
            self.board.say(
                "a trial failed and sweep.stop_on_failure is set: stopping the sweep (running "
                "trials at a checkpoint; `expctl sweep resume --skip-failed "
                f"{self.sweep_dir}` runs the others)"
            )

    def abort(self, timeout: float = 120.0) -> None:
        """Stop the running trials and wait for them (recording nothing: it cannot be written;
        `sweep resume` finds them lost)."""
        self.pool.signal(STOP)
        deadline = time.monotonic() + timeout
        while self.pool.running() and time.monotonic() < deadline:
            self.pool.wait(timeout=1.0)

    def close(self) -> None:
        self.pool.close()
        self.board.close()


def trial_env(slot: resources.Slot, gpus: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """What a trial's environment adds to the driver's (`environ`): the GPUs it sees (none of a
    machine's `gpus` for a CPU trial), and on a GPU shared with other trials how many may share
    it and cuDNN's autotuner off (unless the driver's environment says otherwise)."""
    env = {"CUDA_VISIBLE_DEVICES": ",".join(slot.gpus)} if gpus else {}
    if slot.gpus and slot.shared > 1:
        env[SHARE_ENV] = str(slot.shared)
        if CUDNN_BENCHMARK_ENV not in environ:
            env[CUDNN_BENCHMARK_ENV] = "0"
    return env


def _start(pool: Pool, cfg: Config, slot: resources.Slot, launch_file: Path, gpus: bool) -> Running:
    """Start the trial of `cfg` in `slot`; on a machine with `gpus`, it sees only its own (an
    empty CUDA_VISIBLE_DEVICES hides them all from a CPU trial)."""
    run_dir = RunDir(str(cfg.run.dir))
    ref = TrialRef.read(run_dir.path)
    assert ref is not None, "a trial's run directory holds trial.json"
    env = trial_env(slot, gpus, os.environ)
    request = {
        "run_dir": str(run_dir.path),
        "launch": str(launch_file),
        "where": placement(slot).strip(),
    }
    proc = Proc(
        key=ref.number,
        argv=[json.dumps(request)],
        env=env,
        cores=slot.cores,
        output=run_dir.output,
    )
    pool.start(proc)
    mark(ref, "running", started=time.time(), pid=proc.pid, host=socket.gethostname())
    number = SweepDir.number_of(run_dir.path)
    return Running(number if number is not None else ref.number, proc, slot, ref, _label(ref))


def _label(ref: TrialRef) -> str:
    return str(attrs_of(ref).get("overrides", ""))


def _ended(r: Running, code: int, s: SweepConfig, stopping: bool, board: Board) -> str | None:
    """Record how trial `r` ended where it could not itself; why, if it failed."""
    attrs = attrs_of(r.ref)
    recorded = attrs.get("status")
    if code == 0 and recorded in ("completed", "stopped"):
        board.ended(r, recorded, _result_text(r, s))
        return None
    still_open = is_open(r.ref, s)
    if code in (EXIT_PREEMPTED, EXIT_INTERRUPTED) or (stopping and code < 0):
        if still_open:
            mark(r.ref, "interrupted", ended=time.time())
        board.ended(r, "interrupted", "it continues from its last checkpoint on resume")
        return None
    if recorded == "failed" and not still_open:  # the trial said why
        error = str(attrs.get("error", "")) or f"exit code {code}"
    else:  # it could not: a crash, a kill, a trial that ended without a result
        error = _last_error(r.proc.output, code)
        if still_open:
            finish(r.ref, s, {}, error=RunError(error))
    where = f"  (its output: {r.proc.output})" if r.proc.output.is_file() else ""
    board.ended(r, "failed", error + where)
    return error


def _result_text(r: Running, s: SweepConfig) -> str:
    result = RunDir(r.proc.output.parent).read_result()
    value = result.get(s.metric)
    shown = f"{s.metric}={value:.4g}" if isinstance(value, (int, float)) else "no metric"
    return f"{shown} at step {result.get('step', '?')}"


def _last_error(output: Path, code: int) -> str:
    """The error line a failed trial printed last (its exit code when it printed none); a trial
    killed by a signal printed nothing about it: its last line is not why it ended."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (" (out of memory?)" if code == -signal.SIGKILL else "")
    try:
        lines = output.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        text = line.strip()
        if text.startswith(HEADER):  # the driver's line, not the trial's
            continue
        if text.startswith("expctl: error: ") or (text and not text.startswith(("HINT", "File"))):
            return text.removeprefix("expctl: error: ")[:300]
    return f"exit code {code}"


class _Stop:
    """Why the sweep stops ("interrupt" from Ctrl-C/SIGTERM, "failure"); how many times it was
    asked (the second Ctrl-C kills the trials instead of waiting for their checkpoints)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.count = 0
        self._sent = 0
        self.signum = signal.SIGINT  # the first signal that asked (the exit code says it)

    def ask(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.count += 1

    def pending(self) -> bool:
        """Whether a stop asked since the last call has yet to reach the trials."""
        if self.count > self._sent:
            self._sent = self.count
            return True
        return False

    @contextlib.contextmanager
    def catching(self) -> Any:
        """SIGINT, SIGTERM and SIGHUP ask the sweep to stop while inside (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            first = self.count == 0
            if first:
                self.signum = signal.Signals(signum)
            self.ask("interrupt")
            again = "Ctrl-C again" if signum == signal.SIGINT else "a second signal"
            write(
                sys.stderr,
                f"\nexpctl: {signal.Signals(signum).name}: stopping the running trials at a "
                f"checkpoint ({again} kills them)\n"
                if first
                else "\nexpctl: killing the running trials (they resume from their last "
                "checkpoint)\n",
            )

        # SIGHUP: the terminal closed (unless `nohup` ignores it)
        asked = [signal.SIGINT, signal.SIGTERM]
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            asked.append(signal.SIGHUP)
        previous = {s: signal.signal(s, handler) for s in asked}
        try:
            yield
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
