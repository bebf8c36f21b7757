"""The run directory: decided once, created atomically, written by rank 0 only.

Its name comes from ``run.dir`` when set, else from an id every rank knows without talking (the
Slurm job id, or the id a launcher passes down), else from the time plus a random suffix; the
folder is made with ``mkdir`` (atomic), so two runs started in the same second never share one.
An existing run directory is reused (to resume) only when its frozen config matches, and a new
launch continues the run it holds only with checkpoint.resume=auto (restarts within a launch,
elastic or Slurm requeue, always continue it).

While a launch trains a run it holds RUN_DIR/.lock (`RunLock`, an flock, released by the kernel
when the holder dies): a second launch on a live run is refused, naming the holder, before it
changes anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from expctl import config as config_mod
from expctl import registry
from expctl.config import Config
from expctl.errors import UserError
from expctl.layout import RunDir

# keys that may change between an interrupted run and its continuation
RESUMABLE_CHANGES = (
    "train.max_epochs",
    "train.max_steps",
    "train.log_every",
    "train.gc_every",  # when Python's collector runs: not what is computed
    "launcher.",
    "checkpoint.",
    "env.",
    "logger",  # where metrics go besides metrics.jsonl
)


def deterministic_dir(cfg: Config, run_id: str | None) -> Path | None:
    """The run directory every rank can compute alone, or None when one must be invented."""
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().absolute()
    if run_id:
        return Path(cfg.run.root).expanduser().absolute() / f"{_safe(cfg.run.name)}-{_safe(run_id)}"
    return None


def _safe(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in str(text)).strip("._")
    return out or "run"


class RunLock:
    """RUN_DIR/.lock, held (flock) by the one launch that trains the run; while held the file
    says who holds it, and it is empty once released."""

    def __init__(self, path: Path) -> None:
        self.path = RunDir(path).lock
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 4096, 0).decode(errors="replace")
            os.close(self.fd)
            self.fd = None
            raise UserError(
                f"run.dir={path} is in use by another launch ({describe_holder(holder)})",
                "wait for it to end (`expctl status` follows it) or stop it; for a new run, use "
                "another run.dir",
            ) from None
        job = os.environ.get("SLURM_JOB_ID")
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time())}
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps({**me, **({"job_id": job} if job else {})}).encode(), 0)
        except OSError:
            self.release()
            raise

    def release(self) -> None:
        """Empty the file (no holder) and release the flock."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None


def describe_holder(text: str) -> str:
    """'pid 123 on host vm, Slurm job 45, since 17:40:02' from a lock file's text."""
    try:
        h = json.loads(text)
    except json.JSONDecodeError:
        return "holder unknown"
    parts = [f"pid {h.get('pid')} on host {h.get('host')}"]
    if h.get("job_id"):
        parts.append(f"Slurm job {h['job_id']}")
    if h.get("since"):
        parts.append("since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["since"])))
    return ", ".join(parts)


def is_locked(path: Path) -> str | None:
    """Who holds `path`'s run lock now (None: no live launch trains it). Reads only: a shared
    flock, held for an instant, conflicts with the launch's exclusive one."""
    try:
        fd = os.open(RunDir(path).lock, os.O_RDONLY)
    except OSError:  # no lock file (never launched), or one we may not read
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
    finally:
        os.close(fd)  # releases the shared flock


def create(
    cfg: Config, run_id: str | None = None, restart: bool = False, lock: bool = True
) -> tuple[Config, RunLock | None]:
    """Create (or reopen, to resume) the run directory, take its lock, write config.yaml.

    Args:
        restart: this process restarts a launch already under way (elastic restart, Slurm
            requeue), which continues the run whatever checkpoint.resume says.
        lock: take RUN_DIR/.lock (False: a worker whose launching process holds it).

    Returns:
        The config with ``run.dir`` set to the absolute path of the directory, and the lock
        (the caller releases it when the launch ends, or at once if it only prepares the run).

    Raises:
        UserError: the directory is in use by a live launch, holds another run's config, holds
            a run that checkpoint.resume=never or PATH would start over, or cannot be created.
    """
    path = deterministic_dir(cfg, run_id)
    root = path.parent if path is not None else Path(cfg.run.root).expanduser().absolute()
    root_existed = root.exists()
    if path is None:
        path = _new_unique(root, _safe(cfg.run.name))
        created = True
    else:
        created = _make(path)
    frozen = cfg.replace("run", dir=str(path))
    held: RunLock | None = None
    try:
        if lock:
            held = _lock(path)
        _write_config(path, frozen, fresh=created, restart=restart)
    except BaseException:
        if held is not None:
            held.release()
        if created:
            RunDir(path).lock.unlink(missing_ok=True)
            RunDir(path).imports.unlink(missing_ok=True)
            _remove_if_empty(path)
            if not root_existed:
                _remove_if_empty(root)
        raise
    return frozen, held


def _lock(path: Path) -> RunLock:
    try:
        return RunLock(path)
    except OSError as e:
        raise UserError(
            f"cannot write in run directory {path}: {e.strerror or e}",
            "check the free space and permissions of run.root / run.dir",
        ) from None


# what expctl may leave in a run directory before it holds a config (a lock, a Slurm job that
# never started training, a sweep trial's identity): such a folder is still free to use
_BOOKKEEPING = {RunDir.LOCK, RunDir.JOBS, RunDir.TRIAL, RunDir.SLURM, RunDir.IMPORTS}


def _make(path: Path) -> bool:
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        path.mkdir(mode=0o750)
        return True
    except FileExistsError:
        if not path.is_dir():
            raise UserError(
                f"run.dir {path} exists and is not a directory", "pick another run.dir"
            ) from None
        return False
    except OSError as e:
        raise UserError(
            f"cannot create run directory {path}: {e.strerror}", "check run.root / run.dir"
        ) from None


def _new_unique(root: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        path = root / f"{name}-{stamp}-{secrets.token_hex(2)}"
        if _make(path):
            return path
    raise UserError(f"could not create a fresh run directory under {root}", "check run.root")


def _write_config(path: Path, cfg: Config, fresh: bool, restart: bool) -> None:
    target = RunDir(path).config
    text = config_mod.to_yaml(cfg)
    if not fresh and target.exists():
        old = config_mod.load(path)
        diff = _differences(old.to_dict(), cfg.to_dict())
        blocking = [k for k in diff if not k.startswith(RESUMABLE_CHANGES)]
        if blocking:
            newest = RunDir(path).checkpoint_files()
            raise UserError(
                f"run.dir={path} holds a run with a different config: "
                + _describe(blocking, old.to_dict(), cfg.to_dict()),
                "use a new run.dir"
                + (
                    "; to start from its last checkpoint (weights, optimizer state, step): "
                    f"checkpoint.resume={newest[0]}"
                    if newest
                    else ""
                ),
            )
        resume = cfg.checkpoint.resume
        step = _progress(path)
        if resume != "auto" and not restart and step is not None:
            raise UserError(
                f"run.dir={path} already holds a run (step {step}); "
                f"checkpoint.resume={resume} would overwrite it",
                "use a new run.dir, or checkpoint.resume=auto to continue it",
            )
        if not diff:
            return
    elif not fresh and any(p.name not in _BOOKKEEPING for p in path.iterdir()):
        raise UserError(
            f"run.dir {path} is not empty and holds no config.yaml", "pick an empty or new run.dir"
        )
    found = registry.origins(cfg.imports)  # load_model and -C config.yaml find them anywhere
    if found:
        _write(RunDir(path).imports, json.dumps(found, indent=2) + "\n")
    _write(target, text)


def _write(target: Path, text: str) -> None:
    """Write `target` whole or not at all (a reader never sees half of it)."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.chmod(tmp, 0o640)
        os.replace(tmp, target)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"cannot write {target}: {e.strerror or e}",
            "check the free space and permissions of run.root / run.dir",
        ) from None


def _progress(path: Path) -> int | None:
    """The step the run in `path` reached (newest checkpoint, else last metrics row), or None
    when it holds no run yet (a fresh directory, or one only created for a launch)."""
    newest = RunDir(path).checkpoint_files()
    if newest:
        return int(newest[0].stem.removeprefix("step_"))
    if not RunDir(path).metrics.is_file() or not RunDir(path).metrics.stat().st_size:
        return None
    rows = RunDir(path).metric_rows()
    try:
        return int(rows[-1]["step"]) if rows else 0
    except (ValueError, KeyError, TypeError):
        return 0


def _describe(keys: list[str], old: dict[str, Any], new: dict[str, Any], shown: int = 3) -> str:
    """'optim.lr=0.1 there, 0.01 here' for the first `shown` keys, and how many more differ."""
    parts = [f"{k}={_get(old, k)} there, {_get(new, k)} here" for k in keys[:shown]]
    more = f" (and {len(keys) - shown} more)" if len(keys) > shown else ""
    return "; ".join(parts) + more


def _get(tree: dict[str, Any], dotted: str) -> str:
    value: Any = tree
    for part in dotted.split("."):
        value = value.get(part, "unset") if isinstance(value, dict) else "unset"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    flat_a, flat_b = config_mod.flatten(a), config_mod.flatten(b)
    return [k for k in sorted(flat_a.keys() | flat_b.keys()) if flat_a.get(k) != flat_b.get(k)]


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def discard_if_unstarted(path: Path) -> None:
    """Remove a run directory that a user error stopped before it trained anything: no
    checkpoint, no result, no metrics (nothing half-written stays behind)."""
    import shutil

    run = RunDir(path)
    if (run.checkpoints.is_dir() and any(run.checkpoints.glob("*.pt"))) or run.result.exists():
        return
    if run.metrics.exists() and run.metrics.stat().st_size > 0:
        return
    for file in (run.config, run.imports, run.trial, run.log, run.metrics, run.csv, run.lock):
        file.unlink(missing_ok=True)
    for file in (run.output, run.provenance, *run.diffs()):
        file.unlink(missing_ok=True)
    for folder in (run.tb, run.path / RunDir.WANDB, run.checkpoints, run.code):
        shutil.rmtree(folder, ignore_errors=True)
    _remove_if_empty(path)
    _remove_if_empty(path.parent)  # the runs/ root, when this run made it
