"""What rank 0 writes while training: metrics.jsonl, result.json, train.log, the console, TensorBoard.

Other ranks get a `Reporter` with ``enabled=False``, which writes nothing. A write that fails
(a full disk, a quota, permissions) ends the run with one `RunError` naming the file, as a failed
checkpoint write does; the newest checkpoint stays the one to resume from.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from expctl.errors import RunError
from expctl.layout import RunDir

log = logging.getLogger("expctl")


def warnings_to_stderr() -> None:
    """For commands that only read (status, sweep, show, list): warnings on stderr, one line
    each, prefixed like the CLI's errors."""
    root = logging.getLogger("expctl")
    for h in list(root.handlers):
        if getattr(h, "_expctl", False):
            root.removeHandler(h)
            h.close()
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("expctl: warning: %(message)s"))
    handler._expctl = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.propagate = False


def setup_logging(run_dir: Path | None, enabled: bool, rank: int = 0) -> None:
    """Log INFO to stdout on rank 0 (and to RUN_DIR/train.log); warnings only on other ranks."""
    root = logging.getLogger("expctl")
    root.setLevel(logging.INFO)
    root.propagate = False
    for h in list(root.handlers):
        if getattr(h, "_expctl", False):
            root.removeHandler(h)
            h.close()
    console = logging.StreamHandler(sys.stdout if enabled else sys.stderr)
    console.setLevel(logging.INFO if enabled else logging.WARNING)
    console.setFormatter(
        logging.Formatter("%(message)s" if enabled else f"[rank {rank}] %(message)s")
    )
    handlers: list[logging.Handler] = [console]
    if enabled and run_dir is not None:
        try:
            fh = _LogFile(RunDir(run_dir).log)
        except OSError as e:
            raise write_failed(RunDir(run_dir).log, e) from None
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handlers.append(fh)
    for h in handlers:
        h._expctl = True  # type: ignore[attr-defined]
        root.addHandler(h)


def write_failed(path: Path, error: OSError) -> RunError:
    """The one-line error of a failed write of `path`."""
    return RunError(
        f"could not write {path} ({error.strerror or error}); the checkpoints written so far are "
        f"intact: free space, then run the same command with run.dir={path.parent} to resume"
    )


class _LogFile(logging.FileHandler):
    """train.log: a failed write ends the run with one line (logging would print a traceback
    and carry on), then the file is written no more."""

    broken = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.broken:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        self.broken = True
        raise write_failed(Path(self.baseFilename), error)

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            self.broken = True


def truncate_metrics(run_dir: Path, rows: int | None, step: int) -> int:
    """Keep the metrics.jsonl rows logged before the point training continues from: the first
    `rows` (a checkpoint's count), or without a count those up to `step`. Training logs the rest
    again. The file is rewritten atomically (temporary file + rename); returns the rows dropped."""
    path = RunDir(run_dir).metrics
    if not path.is_file():
        return 0
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    whole = [line for line in lines if line.endswith("\n")]  # a kill may cut the last one
    kept = whole[:rows] if rows is not None else [x for x in whole if _step(x) <= step]
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, e) from None
    return len(lines) - len(kept)


def _step(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 0


class Reporter:
    """Rank 0's outputs. Every method is a no-op when `enabled` is False.

    `rows` counts the lines of metrics.jsonl (those of earlier attempts included); a checkpoint
    records it, so that resuming from it drops exactly the rows logged after it.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        steps_per_epoch: int,
        max_steps: int,
        purge_after: int | None = None,
    ) -> None:
        """`purge_after`: the step a resumed run continues from; TensorBoard hides the events an
        earlier attempt logged after it."""
        self.run_dir, self.enabled = run_dir, enabled
        self.steps_per_epoch, self.max_steps = steps_per_epoch, max_steps
        self.tty = enabled and sys.stdout.isatty()
        self.rows = 0
        self.broken = False  # a write failed: the run is ending with that error
        self._file: TextIO | None = None
        self._tb: Any = None
        self._last_len = 0
        if enabled:
            path = RunDir(run_dir).metrics
            try:
                self.rows = path.read_bytes().count(b"\n") if path.is_file() else 0
                self._file = open(path, "a", buffering=1)  # noqa: SIM115
                self._tb = _tensorboard(run_dir, None if purge_after is None else purge_after + 1)
            except OSError as e:
                raise write_failed(Path(getattr(e, "filename", None) or path), e) from None

    def record(self, step: int, epoch: int, metrics: dict[str, float], kind: str) -> None:
        """Append one event to metrics.jsonl, TensorBoard and the console."""
        if not self.enabled:
            return
        event = {
            "step": step,
            "epoch": epoch,
            **{k: _num(v) for k, v in metrics.items()},
            "time": round(time.time(), 3),
        }
        assert self._file is not None
        try:
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()
            if self._tb is not None:
                for k, v in metrics.items():
                    self._tb.add_scalar(k, v, step)
        except OSError as e:
            self.broken = True
            raise write_failed(Path(getattr(e, "filename", None) or self._file.name), e) from None
        self.rows += 1
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        # `epoch` counts completed epochs; a train line belongs to the one in progress (1-based)
        where = f"epoch {epoch + 1 if kind == 'train' else epoch} step {step}/{self.max_steps}"
        if kind == "train" and self.tty:
            line = f"\r[{_bar(step, self.max_steps)}] {where}  {shown}"
            sys.stdout.write(line + " " * max(0, self._last_len - len(line)))
            sys.stdout.flush()
            self._last_len = len(line)
            return
        if self.tty and self._last_len:
            sys.stdout.write("\n")
            self._last_len = 0
        log.info("%s %s  %s", kind, where, shown)

    def result(self, payload: dict[str, Any]) -> None:
        """Write result.json atomically."""
        if self.enabled:
            write_json(RunDir(self.run_dir).result, payload)

    def close(self) -> None:
        """Flush and close the files (after a failed write, quietly: the error is on its way)."""
        if self.tty and self._last_len:
            sys.stdout.write("\n")
        try:
            if self._file is not None:
                self._file.close()
            if self._tb is not None:
                self._tb.close()
        except OSError as e:
            if not self.broken:
                raise write_failed(Path(getattr(e, "filename", None) or self.run_dir), e) from None
        finally:
            self._file, self._tb = None, None


def write_json(final: Path, payload: dict[str, Any]) -> None:
    """Write a JSON record (result.json, eval/NAME.json) atomically, its folder made if needed.

    Raises:
        RunError: the write failed (nothing is left under the final name).
    """
    write_text(final, json.dumps({k: _num(v) for k, v in payload.items()}, indent=2) + "\n")


def write_text(final: Path, text: str) -> None:
    """Write a text file atomically, its folder made if needed.

    Raises:
        RunError: the write failed (nothing is left under the final name).
    """
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        final.parent.mkdir(mode=0o750, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, final)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise write_failed(final, e) from None


def _tensorboard(run_dir: Path, purge_step: int | None) -> Any:
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(RunDir(run_dir).tb), purge_step=purge_step)


def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf
    return v


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _bar(step: int, total: int, width: int = 20) -> str:
    filled = int(width * min(1.0, step / max(1, total)))
    return "#" * filled + "." * (width - filled)
