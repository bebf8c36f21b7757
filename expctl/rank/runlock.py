"""One launch at a time on a run directory: `RunLock`, held by the launch that trains it, and
`is_locked`, which tells readers (`expctl status`) who holds it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from expctl.errors import UserError
from expctl.layout import RunDir


class RunLock:
    """The run directory held by the one launch that trains it, released by the kernel when the
    holder dies: an flock on the directory itself, which deleting or replacing a file inside
    cannot undo, and one on RUN_DIR/.lock, which says who holds it (and which NFS extends to
    other hosts: a directory's flock holds on one host only). The file is never removed while
    held, and it is empty once released.

    It also remembers what its launch did to the directory before training (made the folder or
    the lock file, replaced config.yaml): `rundir.abandon` undoes that when it is refused.
    """

    def __init__(self, path: Path, made_dir: bool = False) -> None:
        self.path = RunDir(path).lock
        self.made_dir = made_dir  # this launch made the folder
        self.made_parents: list[Path] = []  # and these folders above it (deepest first)
        self.made_lock = False
        self.replaced: bytes | None = None  # config.yaml as it was before this launch
        self.fd: int | None = None
        self.dir_fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        holding = False
        try:
            _hold(self.dir_fd, path, folder=True)
            holding = True
            self.fd, self.made_lock = _open_lock(self.path)
            _hold(self.fd, path)
            job = os.environ.get("SLURM_JOB_ID")
            me = {"host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time())}
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps({**me, **({"job_id": job} if job else {})}).encode(), 0)
        except BaseException:  # refused, or the lock could not be written (a full disk)
            if self.made_lock:
                self.path.unlink(missing_ok=True)
            if holding and made_dir:  # no other launch can be inside it
                with contextlib.suppress(OSError):
                    path.rmdir()
            self.release()
            raise

    def release(self) -> None:
        """Empty the file (no holder) and release both flocks."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None


def _hold(fd: int, path: Path, folder: bool = False) -> None:
    """flock `fd` for this launch, or refuse naming the launch that holds it. A reader's
    shared flock (`is_locked`, an instant) is waited out briefly. `folder`: the directory's
    own lock, skipped where the filesystem has no flock for folders (the file's still holds)."""
    for _ in range(20):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.01)
        except OSError as e:
            if folder and e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return
            raise
    raise UserError(
        f"run.dir={path} is in use by another launch ({_holder(path)})",
        "wait for it to end (`expctl status` follows it) or stop it; for a new run, use "
        "another run.dir",
    )


# a lock file is never followed elsewhere (a planted symlink would have us truncate its target)
# nor waited on (a FIFO in its place)
_SAFE = os.O_NOFOLLOW | os.O_NONBLOCK


def _open_lock(lock: Path) -> tuple[int, bool]:
    """RUN_DIR/.lock opened for the flock, and whether this call made it.

    Raises:
        OSError: it cannot be made or opened, or it is not a plain file.
    """
    try:
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | _SAFE, 0o640), True
    except FileExistsError:
        fd = os.open(lock, os.O_RDWR | _SAFE)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{lock.name} is not a plain file", str(lock))
    return fd, False


def _holder(path: Path) -> str:
    try:
        fd = os.open(RunDir(path).lock, os.O_RDONLY | _SAFE)
    except OSError:
        return f"holder unknown: its {RunDir.LOCK} file is gone"
    try:
        return describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
    except OSError:
        return "holder unknown"
    finally:
        os.close(fd)


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
    flock of the directory and of its lock file, held for an instant, conflicts with a launch's
    exclusive one."""
    for target, flags in ((path, os.O_DIRECTORY), (RunDir(path).lock, _SAFE)):
        try:
            fd = os.open(target, os.O_RDONLY | flags)
        except OSError:  # no such folder or lock file (never launched), or one we may not read
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(path)
        except OSError:  # a filesystem without flock (for folders): the other one tells
            continue
        finally:
            os.close(fd)  # releases the shared flock
    return None
