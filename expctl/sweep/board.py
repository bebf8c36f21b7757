"""A local sweep's console: a line when a trial starts or ends and, on a terminal, one line per
running trial redrawn in place (its step and latest validation metrics, from its metrics.jsonl),
instead of the trials' interleaved logs. A console that goes away (the terminal closed, the
reader of a pipe such as `| head` ended) loses what is printed after, never the sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from expctl.layout import RunDir
from expctl.sweep import resources

if TYPE_CHECKING:
    from expctl.sweep.trials import Running


class Board:
    """What the driver prints: a line when a trial starts or ends and, on a terminal, a block of
    one line per running trial redrawn in place (elsewhere, that block every `quiet_s`)."""

    def __init__(self, out: TextIO, sweep_dir: Path, quiet_s: float = 60.0) -> None:
        self.out, self.sweep_dir, self.quiet_s = out, sweep_dir, quiet_s
        self.tty = out.isatty() and os.environ.get("TERM") != "dumb"
        self.tick = 1.0 if self.tty else 2.0
        self._drawn = 0
        self._last = time.monotonic()

    def _clear(self) -> str:
        drawn, self._drawn = self._drawn, 0
        return f"\x1b[{drawn}F\x1b[J" if drawn else ""

    def _write(self, text: str) -> None:
        if not write(self.out, text):
            self.tty = False

    def say(self, text: str) -> None:
        self._write(f"{self._clear()}expctl: {text}\n")

    def started(self, r: Running) -> None:
        self.say(f"trial {r.number} started{placement(r.slot)}: {r.label}")

    def ended(self, r: Running, status: str, detail: str) -> None:
        took = time.time() - r.proc.started
        self.say(f"trial {r.number} {status} in {took:.1f} s: {detail}")

    def show(self, running: Any) -> None:
        rows = sorted(running, key=lambda r: r.number)
        now = time.monotonic()
        if not self.tty:
            if rows and now - self._last >= self.quiet_s:
                self._last = now
                self._write("".join(f"expctl:   {_progress(r)}\n" for r in rows))
            return
        # each line cut to the terminal's width: a wrapped one would take two rows, and the
        # next redraw would move up too few
        width = max(20, shutil.get_terminal_size().columns - 1)
        block = self._clear() + "".join(f"  {_progress(r)}"[:width] + "\n" for r in rows)
        self._drawn = len(rows)
        self._write(block)

    def close(self) -> None:
        if self.tty:
            self._write(self._clear())


def write(stream: TextIO, text: str) -> bool:
    """Write and flush `text`; False when the console is gone (EPIPE, EIO): from then on, what
    this process prints there goes to /dev/null (and Python's exit raises nothing about it)."""
    try:
        stream.write(text)
        stream.flush()
        return True
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        return False


def placement(slot: resources.Slot) -> str:
    """` on GPU 1 (cores 4-7)`: where a trial runs, in its start line and its output.log's header."""
    gpus = f" on GPU {','.join(slot.gpus)}" if slot.gpus else ""
    cores = f"cores {_ranges(slot.cores)}" if slot.cores else ""
    return f"{gpus} ({cores})" if cores else gpus


def _ranges(cores: tuple[int, ...]) -> str:
    """0,1,2,3,6 -> 0-3,6"""
    out: list[str] = []
    for c in cores:
        if out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _progress(r: Running) -> str:
    """`trial 3  GPU 0  step 120  val/acc=0.81  0:42  optim.lr=0.1`, from its metrics file."""
    step, metrics = _tail(RunDir(r.proc.output.parent).metrics)
    took = int(time.time() - r.proc.started)
    where = f"GPU {','.join(r.slot.gpus)}  " if r.slot.gpus else ""
    shown = "  ".join(f"{k}={v:.4g}" for k, v in metrics.items())
    return (
        f"trial {r.number}  {where}step {step if step is not None else '-'}  {shown}  "
        f"{took // 60}:{took % 60:02d}  {r.label}"
    ).replace("    ", "  ")


def _tail(path: Path, size: int = 8192) -> tuple[int | None, dict[str, float]]:
    """The last step and the latest value of each val/ metric in a metrics.jsonl, from its end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - size)
            f.seek(start)
            lines = f.read().decode(errors="replace").splitlines()[1 if start else 0 :]
    except OSError:
        return None, {}
    step: int | None = None
    metrics: dict[str, float] = {}
    for line in lines:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            row = json.loads(line)
            step = int(row.get("step", step))
            metrics.update(
                {k: float(v) for k, v in row.items() if k.startswith("val/") and k != "val/loss"}
            )
    return step, metrics
