"""What rank 0 writes while training: metrics.jsonl, result.json, train.log, the console, TensorBoard.

Other ranks get a `Reporter` with ``enabled=False``, which writes nothing. A write that fails
(a full disk, a quota, permissions) ends the run with one `RunError` naming the file, as a failed
checkpoint write does; the newest checkpoint stays the one to resume from.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from expctl.atomic import write_atomically
from expctl.builtin import loggers as loggers_mod
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
    console = _Console(stdout=enabled)
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
    """The one-line error of a failed write of `path` (a run directory's file, at any depth, or
    the directory itself)."""
    run_dir = next((p for p in (path, *path.parents) if RunDir(p).is_run()), path.parent)
    return RunError(
        f"could not write {path} ({error.strerror or error}); the checkpoints written so far are "
        f"intact: free space, then run the same command with run.dir={run_dir} to resume"
    )


class _Console(logging.StreamHandler):
    """The console: lines go above a progress bar (tqdm.write), except those logged with
    ``extra={"console": False}`` (train lines, which the bar shows on a terminal). The stream is
    sys.stdout or sys.stderr as they are at each line, not as they were when the run began (a
    handler left by a finished run, in a notebook or a test, never writes to a closed stream)."""

    def __init__(self, stdout: bool) -> None:
        self._stdout = stdout
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stdout if self._stdout else sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass  # StreamHandler.__init__ sets it: the property decides

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "console", True):
            return
        from tqdm import tqdm  # noqa: PLC0415 - tqdm off read-only commands (cli imports this)

        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:
            self.handleError(record)


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
    try:
        write_atomically(path, "".join(kept))
    except OSError as e:
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

    The console: on a terminal, a progress bar (tqdm) advanced every optimizer step, with the
    loss of the last log point, the rate in samples/s and the time left, and the train lines go
    to train.log only; elsewhere (CI, Slurm logs) each train line is printed, with its ETA.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        max_steps: int,
        start_step: int = 0,
        loggers: Mapping[str, Mapping[str, Any]] | None = None,
        samples_per_step: int = 1,
    ) -> None:
        """`start_step`: where training continues from; `loggers`: name -> arguments
        (`expctl.builtin.loggers`); `samples_per_step`: the global batch, for the rate."""
        self.run_dir, self.enabled = run_dir, enabled
        self.max_steps, self.start_step, self.samples_per_step = (
            max_steps,
            start_step,
            samples_per_step,
        )
        self.tty = enabled and sys.stdout.isatty()
        self.rows = 0
        self.broken = False  # a write failed: the run is ending with that error
        self._file: TextIO | None = None
        self._loggers: list[Any] = []
        self._sent: dict[str, float] = {}  # the newest value of each metric the loggers got
        self._bar: Any = None
        self._started = time.perf_counter()
        if enabled:
            path = RunDir(run_dir).metrics
            try:
                self.rows = path.read_bytes().count(b"\n") if path.is_file() else 0
                self._file = open(path, "a", buffering=1)  # noqa: SIM115
                self._loggers = loggers_mod.open_all(loggers or {}, run_dir, start_step)
            except OSError as e:
                raise write_failed(Path(getattr(e, "filename", None) or path), e) from None

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Hand the loggers the run's config (as written to config.yaml), flattened."""
        params = loggers_mod.flatten(config)
        self._each(lambda logger: logger.log_hparams(params))

    def advance(self, step: int, epoch: int) -> None:
        """After each optimizer step: move the bar (a terminal only). Plain integers: no sync."""
        if not self.tty:
            return
        desc = f"epoch {epoch}"
        if self._bar is None:
            self._bar = _bar(self.max_steps, self.start_step, self.samples_per_step, desc)
        if self._bar.desc != desc:
            self._bar.set_description_str(desc, refresh=False)
        self._bar.update(step - self._bar.n)

    def record(self, step: int, epoch: int, metrics: dict[str, float], kind: str) -> None:
        """Append one event to metrics.jsonl, the loggers, train.log and the console."""
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
        except OSError as e:
            self.broken = True
            raise write_failed(Path(getattr(e, "filename", None) or self._file.name), e) from None
        self.rows += 1
        self._send({"epoch": epoch, **metrics}, step)
        shown = "  ".join(f"{k}={_fmt(v)}" for k, v in metrics.items())
        where = f"epoch {epoch} step {step}/{self.max_steps}"  # `epoch`: counted from 1
        if kind == "train":
            shown += f"  eta {self._eta(step)}"
            if self._bar is not None:
                self._bar.set_postfix_str(_brief(metrics), refresh=False)
        # on a terminal the bar shows the train line; train.log always gets it
        log.info(
            "%s %s  %s", kind, where, shown, extra={"console": kind != "train" or not self.tty}
        )

    def result(self, payload: dict[str, Any]) -> None:
        """Write result.json atomically; the loggers get its metrics that no event held yet."""
        if not self.enabled:
            return
        write_json(RunDir(self.run_dir).result, payload)
        final = {
            k: v
            for k, v in payload.items()
            if isinstance(v, (int, float))
            and not isinstance(v, bool)
            and k not in ("step", "epoch")
        }
        news = {k: v for k, v in final.items() if self._sent.get(k) != v}
        if news:
            self._send({"epoch": payload.get("epoch", 0), **news}, int(payload.get("step", 0)))

    def close(self, status: str = "failed") -> None:
        """End the bar, close the loggers with the run's `status`
        (`expctl.builtin.loggers.STATUSES`) and the files (after a failed write, quietly: the
        error is on its way)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        try:
            self._each(lambda logger: logger.close(status))
            if self._file is not None:
                self._file.close()
        except OSError as e:
            if not self.broken:
                raise write_failed(Path(getattr(e, "filename", None) or self.run_dir), e) from None
        finally:
            self._file, self._loggers = None, []

    def _send(self, metrics: dict[str, float], step: int) -> None:
        self._each(lambda logger: logger.log_metrics(metrics, step))
        self._sent.update(metrics)

    def _each(self, call: Any) -> None:
        """Call every logger; a failed write ends the run with one line naming the file."""
        for logger in self._loggers:
            try:
                call(logger)
            except OSError as e:
                self.broken = True
                raise write_failed(Path(getattr(e, "filename", None) or self.run_dir), e) from None

    def _eta(self, step: int) -> str:
        """The time left at this launch's pace so far."""
        done = step - self.start_step
        spent = time.perf_counter() - self._started
        return _interval(spent / done * (self.max_steps - step)) if done > 0 else "?"


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
    try:
        final.parent.mkdir(mode=0o750, exist_ok=True)
        write_atomically(final, text)
    except OSError as e:
        raise write_failed(final, e) from None


def _num(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf
    return v


def _fmt(v: Any) -> str:
    """A metric for the console: 4 significant digits; large values in full, with thousands
    separators (a rate of 39,970 samples/s, not 3.997e+04)."""
    if isinstance(v, float) and math.isfinite(v) and abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _brief(metrics: Mapping[str, float]) -> str:
    """What the bar shows of a train event: its train/ metrics, shortened (loss=0.4312)."""
    return " ".join(
        f"{k.removeprefix('train/')}={_fmt(v)}"
        for k, v in metrics.items()
        if k.startswith("train/")
    )


def _interval(seconds: float) -> str:
    from tqdm import tqdm  # noqa: PLC0415 - tqdm off read-only commands (cli imports this)

    return str(tqdm.format_interval(seconds))


def _bar(total: int, initial: int, samples_per_step: int, desc: str) -> Any:
    """A tqdm bar of optimizer steps that shows the rate in samples/s (40.0k samples/s) and
    follows the terminal's width."""
    from tqdm import tqdm  # noqa: PLC0415 - tqdm off read-only commands (cli imports this)

    class Bar(tqdm):
        @property
        def format_dict(self) -> dict[str, Any]:  # tqdm's documented way to add fields
            d = dict(super().format_dict)
            rate = d["rate"] or ((d["n"] - d["initial"]) / d["elapsed"] if d["elapsed"] else 0)
            d["samples"] = tqdm.format_sizeof(rate * samples_per_step)
            return d

    return Bar(
        total=total,
        initial=initial,
        desc=desc,
        file=sys.stdout,
        dynamic_ncols=True,
        unit="step",
        bar_format="{desc} {percentage:3.0f}%|{bar}| step {n}/{total} "
        "[{elapsed}<{remaining}, {samples} samples/s{postfix}]",
    )
