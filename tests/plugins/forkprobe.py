"""Test plugin (`imports: [forkprobe]`): each fork() of a process that imported it appends one
line to $FORK_PROBE: the pid and the names of the process's other Python threads at that moment
(a child forked while another thread ran can hang: DESIGN.md trap 13)."""

from __future__ import annotations

import json
import os
import sys
import threading


def _before_fork() -> None:
    path = os.environ.get("FORK_PROBE")
    if not path:
        return
    me = threading.get_ident()
    others = [t.name for t in threading.enumerate() if t.ident != me]
    frames = [ident for ident in sys._current_frames() if ident != me]  # threads Python knows
    with open(path, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "threads": others, "frames": len(frames)}) + "\n")


os.register_at_fork(before=_before_fork)
