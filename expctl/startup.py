"""What makes a process's start (and end) cheaper without changing what it does: Python's cycle
collector kept off torch's modules while they load and afterwards (`paused_gc`,
`process_is_the_run`), and left out at a sweep driver's exit (`ending`).

These concern starting and ending a process (the CLI, a worker, the sweep's zygote, a rank's
first optimizer importing torch._dynamo), not training: when the collector runs while a rank
trains is `expctl.rank.collector.GarbageCollection`, which the loop creates."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from expctl.errors import Terminated


@contextlib.contextmanager
def paused_gc(freeze: bool = True) -> Iterator[None]:
    """Python's cycle collector off inside, as it was on leaving; with `freeze`, what an import
    inside made is then frozen (`gc.freeze`), out of the collector's sight. For a process's
    start-up (imports), not for training (`rank.collector.GarbageCollection`).

    Freeze only before any process group exists: with the freeze after the groups were made
    (around the first optimizer), 1 of 15 two-worker runs ended with a worker aborting as its
    interpreter exited ("terminate called without an active exception"); none of 30 without it.
    Frozen objects in reference cycles are never collected, so the groups' objects live on to
    the interpreter's end.

    Importing torch (and torch._dynamo, which torch.optim imports on the first optimizer built)
    allocates millions of objects that live as long as the process: the collector scans them
    again and again as they come (~15% of the import), and once more, all of them, at the first
    collections after. Freezing only when modules were imported keeps a second run in the same
    process (a notebook, an inline sweep) from pinning its predecessor's garbage.
    """
    was, modules = gc.isenabled(), len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if freeze and len(sys.modules) > modules:
            gc.freeze()
        if was:
            gc.enable()


_ONE_RUN = False  # this process exists for one run (`expctl run`), and ends with it


def process_is_the_run() -> None:
    """Say that this process ends with its run (the CLI's `run`), so that objects made for the
    run may be frozen with torch's (`freeze_for_this_run`): nothing outlives the process to be
    pinned. A notebook's `expctl.run` never says it: its runs' garbage stays collectable."""
    global _ONE_RUN
    _ONE_RUN = True


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises `Terminated` inside (the CLI's `run`), as SIGINT raises KeyboardInterrupt.
    Training's stop flag and torch's elastic agent take the signal over while they run; before
    them (composing, making the run directory, building, starting the workers), its default
    action ended the process with no word of where the run was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated


def freeze_for_this_run(distributed: bool) -> bool:
    """Whether `paused_gc` may freeze at a point where the run's own objects exist (the first
    optimizer, which imports torch._dynamo): only in a process that ends with the run, and not
    in a rank of a process group (frozen, its groups' objects are torn down in the wrong order
    at exit: 1 of 15 two-worker runs aborted)."""
    return _ONE_RUN and not distributed


def ending() -> None:
    """Say that this process ends now (a sweep's driver, its sweep done): what it made is left
    to the operating system. Python's collections at exit would walk every object that torch,
    torch._dynamo and Optuna made (1-2 s on a small machine, after the sweep's last line); none
    of them needs collecting. Not for a process that goes on (a notebook's `expctl.sweep.multirun`)."""
    gc.freeze()


# The program of a process expctl starts itself (`python -c WORKER_MAIN _worker ...`: a local
# worker; `_zygote`: a sweep's trial forker). `python -m expctl` would search
# the working directory first, before expctl itself is imported: a json.py or expctl.py there
# would run in every worker. `-c` puts it first too, as '', which goes before anything is
# imported (-P, which does the same, needs Python 3.11); the worker searches what the user named:
# PYTHONPATH, then `imports:` in the working directory and beside the -C file.
WORKER_MAIN = (
    "import sys\n"
    "if sys.path[:1] == [''] and not getattr(sys.flags, 'safe_path', False):\n"
    "    del sys.path[0]\n"
    "from expctl.cli import main\n"
    "sys.exit(main())\n"
)


def die_with_parent() -> None:
    """End this process when its parent does, even by SIGKILL (Linux's PR_SET_PDEATHSIG): a
    local worker with its launcher, a sweep's zygote and trials with the driver, a DataLoader
    worker with its rank; an orphan would train on (or hold files) beside the next launch. A
    parent already gone before the request took effect ends this process now. Elsewhere than
    Linux, nothing."""
    import ctypes  # noqa: PLC0415 - only the processes that ask
    import ctypes.util  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)
