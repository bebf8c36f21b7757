"""Where a run came from: RUN_DIR/provenance.json, written by rank 0 as training starts.

A *launch* is one command that trains the run (`expctl run`, a sweep, `expctl sweep resume`):
its argv, the -C file and the overrides as given, the working directory, the user's git
repository at that moment (the -C file's, else the working directory's: commit, branch, dirty
flag, untracked files; the uncommitted diff goes to RUN_DIR/git-ID.diff, at most 1 MiB) and,
under launcher=slurm, the code snapshot its jobs import (`snapshot.py`). An *attempt* is one
start of training under a launch (the first, a Slurm requeue, an elastic restart): host, CPUs,
GPUs, the Slurm job, package versions, start time. The file lists every launch, oldest first,
each with its attempts; a re-run that finds the run completed trains nothing and records nothing.

No environment variable is written (values from `${oc.env:...}` stay out of every file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expctl.layout import RunDir
from expctl.rank.report import write_json, write_text

if TYPE_CHECKING:  # `expctl status` reads provenance without torch, which dist.py may import
    from expctl.dist import DistEnv

DIFF_LIMIT = 1 << 20  # bytes of uncommitted diff kept per launch
UNTRACKED_SHOWN = 100  # untracked file names listed per launch
PACKAGES = ("torch", "torchvision", "hydra-core", "omegaconf", "submitit", "optuna", "expctl")


@dataclass(frozen=True)
class Launch:
    """One command that trains a run: what was typed, and the user's code when it was typed."""

    config_file: str | None
    overrides: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    cwd: str = ""
    started: float = 0.0
    id: str = ""
    pinned: bool = False  # `git` and `diff` were read
    git: dict[str, Any] | None = None
    diff: str = ""
    snapshot: dict[str, Any] | None = None  # launcher=slurm: `snapshot.copy`'s record

    @classmethod
    def here(cls, config_file: str | None, overrides: Any = ()) -> Launch:
        """This process's command, with the -C file `config_file` and `overrides` as given."""
        path = str(Path(config_file).expanduser().absolute()) if config_file else None
        return cls(
            config_file=path,
            overrides=tuple(str(o) for o in overrides),
            argv=tuple(sys.argv),
            cwd=os.getcwd(),
            started=time.time(),
            id=time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2),
        )

    def folder(self) -> Path:
        """Where the user's code lives: the -C file's folder, else the working directory."""
        return Path(self.config_file).parent if self.config_file else Path(self.cwd)

    def pin(self) -> Launch:
        """This launch with the state of the user's repository read now (once): a Slurm job
        records what was there when it was submitted, not when it starts."""
        if self.pinned:
            return self
        git, diff = git_state(self.folder())
        return dataclasses.replace(self, pinned=True, git=git, diff=diff)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Launch:
        data = json.loads(text)
        data["overrides"], data["argv"] = tuple(data["overrides"]), tuple(data["argv"])
        return cls(**data)


def git_output(folder: Path, *args: str, limit: int = DIFF_LIMIT) -> tuple[str, bool] | None:
    """git's output in `folder` (at most `limit` bytes, and whether it was cut there), or None
    when git is missing or fails (no repository, no commit yet, a repository it distrusts)."""
    try:
        proc = subprocess.Popen(
            ["git", "-C", str(folder), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
    except OSError:
        return None
    assert proc.stdout is not None
    with proc:
        data = proc.stdout.read(limit + 1)
        cut = len(data) > limit
        if cut:
            proc.kill()
        code = proc.wait()
    if code != 0 and not cut:
        return None
    return data[:limit].decode(errors="replace"), cut


def repo_root(folder: Path) -> Path | None:
    """The top folder of the git repository holding `folder` (None: none, or no git)."""
    out = git_output(folder, "rev-parse", "--show-toplevel")
    return Path(out[0].strip()) if out and out[0].strip() else None


def git_state(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """The repository holding `folder`: its root, commit, branch, dirty flag and untracked
    files, and the uncommitted diff against the commit (None, "" outside a repository)."""
    root = repo_root(folder)
    if root is None:
        return None, ""
    commit = git_output(root, "rev-parse", "--verify", "-q", "HEAD")
    branch = git_output(root, "rev-parse", "--abbrev-ref", "HEAD")
    status = git_output(root, "status", "--porcelain", "-z")
    entries = [e for e in (status[0] if status else "").split("\0") if e]
    untracked = [e[3:] for e in entries if e.startswith("?? ")]
    changed = [e for e in entries if not e.startswith("?? ")]
    diff = git_output(root, "diff", "HEAD", "--no-color", "--no-ext-diff") if commit else None
    text, cut = diff or ("", False)
    if cut:
        text += f"\n# expctl: diff truncated at {DIFF_LIMIT} bytes\n"
    state = {
        "root": str(root),
        "commit": commit[0].strip() if commit else None,  # None: no commit yet
        "branch": branch[0].strip() if branch and commit else None,  # HEAD: detached
        "dirty": bool(changed),  # tracked files differ from the commit: see the diff
        "untracked": untracked[:UNTRACKED_SHOWN],
        "untracked_count": len(untracked),
        "diff_truncated": cut,
    }
    return state, text


def record(run_dir: Path, launch: Launch, env: DistEnv) -> None:
    """Add this attempt (and its launch, at its first attempt) to RUN_DIR/provenance.json.

    Raises:
        RunError: the file could not be written.
    """
    run = RunDir(run_dir)
    launches = list(run.read_provenance().get("launches", []))  # a damaged file: [] (warned)
    entry = next((e for e in launches if e.get("id") == launch.id), None)
    if entry is None:
        entry = _launch_entry(run, launch.pin())
        launches.append(entry)
    before = entry.get("attempts")
    entry["attempts"] = [*(before if isinstance(before, list) else []), attempt(env)]
    write_json(run.provenance, {"launches": launches})


def _launch_entry(run: RunDir, launch: Launch) -> dict[str, Any]:
    fields = dataclasses.asdict(launch)
    diff = fields.pop("diff")
    del fields["pinned"]
    fields["started"] = _when(launch.started)
    if diff:
        write_text(run.diff(launch.id), diff)
        fields["diff_file"] = run.diff(launch.id).name
    return fields


def attempt(env: DistEnv) -> dict[str, Any]:
    """This process's machine and packages, and its place in the job."""
    return {
        "started": _when(time.time()),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus": gpus(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions(),
        "world_size": env.world_size,
        "started_by": "inline" if env.source == "single" else env.source,
        "restart": env.restart_count,
        "slurm": _slurm_ids(env),
    }


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))


def gpus() -> list[str]:
    """The names of the visible CUDA devices, when this process already imported torch (the
    rank has; this never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]


def versions() -> dict[str, str | None]:
    """Installed versions of the packages a run depends on (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    # this checkout's own version (the package is loaded: this module is in it), also where
    # another copy is installed
    out["expctl"] = sys.modules["expctl"].__version__
    return out


def _slurm_ids(env: DistEnv) -> dict[str, str] | None:
    if not env.job_id:
        return None
    job, _, task = env.job_id.partition("_")
    if task:
        return {"job_id": env.job_id, "array_job_id": job, "array_task_id": task}
    return {"job_id": env.job_id}
