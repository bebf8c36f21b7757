"""Trial processes of a local sweep, side by side: started from a zygote, watched, stopped.

A trial is a run in a process of its own (`expctl _trial TRIAL_DIR`): it sees only its GPUs
(CUDA_VISIBLE_DEVICES) and cores (its CPU affinity), writes its console output to
TRIAL_DIR/output.log and reports to the sweep's ledger through its hooks, as any trial does.

Processes come from a zygote: a process that has imported torch once and forks one child per
trial, so a trial starts in milliseconds instead of paying torch's import (seconds on a small
machine, each time). The zygote is forked from the driver while the driver has no other thread
(DESIGN.md trap 13: a fork while another thread holds a lock can hang the child), else started
as a fresh interpreter. Each trial gets a session of its own, so a Ctrl-C reaches the driver
only, which stops every trial at a checkpoint; trials die with the zygote, and the zygote with
the driver (a SIGKILLed driver leaves no trial training behind).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl.dist import apply_env
from expctl.errors import RunError
from expctl.startup import WORKER_MAIN, die_with_parent, paused_gc

Entry = Callable[[Sequence[str]], int]  # a trial process's main: argv -> exit code
# What each trial process runs, named rather than passed: the zygote imports it after torch, so
# that a driver can start its zygote before it imports the sweep's own modules (cli.py does)
TRIAL_MAIN = "expctl.sweep.trialprocess:trial_main"


@dataclass
class Proc:
    """A trial process: what it is (`key`), its pid once started, its exit code once ended."""

    key: Any
    argv: list[str]
    env: dict[str, str]
    cores: tuple[int, ...]
    output: Path
    pid: int | None = None
    code: int | None = None
    started: float = field(default_factory=time.time)


class Pool:
    """Start trial processes and learn how they end; `close` kills what still runs."""

    def __init__(self, entry: str = TRIAL_MAIN) -> None:
        self._procs: dict[int, Proc] = {}
        self._waiting: list[Proc] = []  # asked to start, pid not yet known
        self._buf = b""
        self._sel = selectors.DefaultSelector()
        self._environ = dict(os.environ)  # the zygote's; a trial gets what changed since too
        if threading.active_count() == 1 and hasattr(os, "fork"):
            self._fork_zygote(entry)
        else:  # another thread may hold a lock a fork would copy: a fresh interpreter
            self._spawn_zygote()
        self._sel.register(self._events, selectors.EVENT_READ)

    def _fork_zygote(self, entry: str) -> None:
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the zygote; it never returns
            os.close(req_w)
            os.close(ev_r)
            code = 0
            try:
                serve(req_r, ev_w, entry)
            except BaseException:  # noqa: BLE001 - the zygote's end is reported by EOF
                code = 1
            os._exit(code)
        os.close(req_r)
        os.close(ev_w)
        self._zygote_pid = pid
        self._requests = os.fdopen(req_w, "w", buffering=1)
        self._events = os.fdopen(ev_r, "rb", buffering=0)

    def _spawn_zygote(self) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_MAIN, "_zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=False,
        )
        assert proc.stdin is not None and proc.stdout is not None
        self._zygote_pid = proc.pid
        self._requests = os.fdopen(os.dup(proc.stdin.fileno()), "w", buffering=1)
        self._events = os.fdopen(os.dup(proc.stdout.fileno()), "rb", buffering=0)
        proc.stdin.close()
        proc.stdout.close()
        self._popen = proc

    def start(self, p: Proc) -> None:
        """Ask the zygote for a process; its pid arrives with `wait`."""
        changed = {k: v for k, v in os.environ.items() if self._environ.get(k) != v}
        request = {
            "argv": p.argv,
            "env": {**changed, **p.env},
            "cores": list(p.cores),
            "output": str(p.output),
        }
        self._waiting.append(p)
        self._requests.write(json.dumps(request) + "\n")
        self._pid_of(p)

    def _pid_of(self, p: Proc) -> None:
        """Wait for the started event of `p` (the zygote answers at once)."""
        while p.pid is None:
            if not self._read(timeout=30.0):
                raise RunError("the sweep's zygote process (the trials' forker) did not answer")

    def _read(self, timeout: float) -> bool:
        """Read the zygote's events for up to `timeout` s; False if it ended or said nothing."""
        if not self._sel.select(timeout):
            return False
        chunk = self._events.read(65536)
        if not chunk:
            raise RunError(
                "the sweep's zygote process (the trials' forker) ended, and its running trials "
                "with it"
            )
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            ev = json.loads(line)
            if ev["event"] == "started":
                p = self._waiting.pop(0)
                p.pid, p.started = int(ev["pid"]), time.time()
                self._procs[p.pid] = p
            elif ev["event"] == "exited":
                ended = self._procs.get(int(ev["pid"]))
                if ended is not None:
                    ended.code = int(ev["code"])
        return True

    def wait(self, timeout: float) -> list[Proc]:
        """The processes that ended within `timeout` seconds (forgotten by the pool)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = [p for p in self._procs.values() if p.code is not None]
            if ended:
                for p in ended:
                    del self._procs[p.pid or 0]
                return ended
            left = deadline - time.monotonic()
            if not self._read(max(left, 0.0)) and left <= 0:
                return []

    def running(self) -> list[Proc]:
        return list(self._procs.values())

    def signal(self, signum: int) -> None:
        """Send `signum` to every running trial (its whole process group: agent and workers of a
        local launch)."""
        for p in self._procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid or 0, signum)

    def close(self) -> None:
        """Kill what still runs and end the zygote (once: a second call does nothing)."""
        if self._requests.closed:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._requests.close()
        with contextlib.suppress(OSError):  # it may still be importing torch, started early
            os.kill(self._zygote_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(self._zygote_pid, 0)
        self._sel.close()
        self._events.close()


# ---------------------------------------------------------------------------------------------
# the zygote: it imports torch once, then forks one child per request
# ---------------------------------------------------------------------------------------------


def serve(req_fd: int, ev_fd: int, entry_name: str) -> None:
    """The zygote's loop: fork a trial per request line; report pids and exit codes as lines.
    It ends, killing its trials, when the driver closes the request pipe (or dies)."""
    # Ctrl-C, the terminal's hang-up and a SIGTERM to every process of the sweep (systemd's
    # stop, `kill -- -PGID`) are the driver's to handle: it stops the trials at a checkpoint
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent()
    with paused_gc():
        # torch, and torch._dynamo, which a trial's first optimizer imports (seconds: more than
        # a short trial trains), imported once for every trial; neither starts a thread
        # what each trial imports next: its launch, its frozen config (OmegaConf), and Optuna,
        # which reports to the study (0.1 s a trial, a tenth of a short trial's start)
        import omegaconf  # noqa: F401, PLC0415 - in the zygote, never in the driver
        import optuna  # noqa: F401, PLC0415 - in the zygote, never in the driver
        import torch._dynamo  # noqa: F401, PLC0415 - in the zygote, never in the driver

        from expctl.jobs import launch  # noqa: F401, PLC0415 - the same

        module, _, name = entry_name.partition(":")
        entry: Entry = getattr(importlib.import_module(module), name)

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    sel = selectors.DefaultSelector()
    sel.register(req_fd, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    buf = b""

    def say(event: dict[str, Any]) -> None:
        os.write(ev_fd, (json.dumps(event) + "\n").encode())

    while True:
        for key, _ in sel.select():
            if key.fd == wake_r:
                os.read(wake_r, 4096)
                _reap(children, say)
                continue
            chunk = os.read(req_fd, 65536)
            if not chunk:  # the driver is gone: so are its trials
                for pid in children:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pid, signal.SIGKILL)
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                pid = _fork_trial(json.loads(line), entry, (req_fd, ev_fd, wake_r, wake_w))
                children.add(pid)
                say({"event": "started", "pid": pid})
        _reap(children, say)


def _reap(children: set[int], say: Callable[[dict[str, Any]], None]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        say({"event": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _fork_trial(request: dict[str, Any], entry: Entry, fds: tuple[int, ...]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1  # pragma: no cover - below runs in the trial's process
    try:
        os.setsid()  # the terminal's Ctrl-C goes to the driver, which stops trials at a checkpoint
        die_with_parent()
        signal.set_wakeup_fd(-1)
        for fd in fds:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        if request["cores"] and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, request["cores"])
        apply_env(request["env"])
        code = entry(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - a bug: its traceback goes to the trial's output
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def zygote_main(entry: str = TRIAL_MAIN) -> int:
    """`expctl _zygote`: the zygote of a driver that could not fork one (stdin/stdout pipes)."""
    serve(sys.stdin.fileno(), sys.stdout.fileno(), entry)
    return 0
