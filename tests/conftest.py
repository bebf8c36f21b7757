"""Shared helpers: run the real CLI in a subprocess, small configs on synthetic data."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGINS = Path(__file__).resolve().parent / "plugins"
sys.path.insert(0, str(PLUGINS))  # in-process tests import the same plugins as `imports:` does

TINY = """\
model: {name: mlp, hidden: [32]}
data: {name: synthetic, shape: [20], num_classes: 4, num_samples: 512, val_samples: 128, batch_size: 32}
optim: {name: sgd, lr: 0.1, momentum: 0.9}
sched: {name: null}
train: {max_epochs: 2, log_every: 4}
"""

# the same run as overrides, for in-process tests: an MLP on 32 synthetic samples, seconds
SMALL = [
    "model=mlp",
    "model.hidden=[8]",
    "data=synthetic",
    "data.shape=[6]",
    "data.num_classes=3",
    "data.num_samples=32",
    "data.val_samples=16",
    "data.batch_size=8",
]


def pytest_configure(config: pytest.Config) -> None:
    """pytest 9.2 reads a test's id where pytest-xdist (3.8) no longer writes its xdist_group:
    under `--dist loadgroup` every group would be ignored, and the Slurm groups' jobs would meet
    on the cluster in any order. Refuse that pair rather than run a suite that fails at random."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        xdist = tuple(int(x) for x in version("pytest-xdist").split(".")[:2])
    except PackageNotFoundError:
        return
    if getattr(config.option, "dist", None) == "loadgroup" and (
        pytest.version_tuple >= (9, 2) and xdist <= (3, 8)
    ):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks --dist loadgroup of pytest-xdist "
            f"{version('pytest-xdist')}: install the versions .ci/constraints.txt pins"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the Slurm tests (a few xdist groups, each serial on one worker: the run's
    critical path) start at once instead of after the files collected before them; then the slow
    tier."""
    rank = {"slurm": 0, "slow": 1}
    items.sort(
        key=lambda it: min((rank[m.name] for m in it.iter_markers() if m.name in rank), default=2)
    )


@pytest.fixture(autouse=True)
def _no_logging_from_earlier_tests() -> Iterator[None]:
    """Each test starts with expctl's logger as a fresh process has it: an in-process run leaves
    its console handler behind (as it should in a notebook), which would print a later test's
    INFO lines (`env: ...`) into output that test checks."""
    import logging

    yield
    root = logging.getLogger("expctl")
    for h in list(root.handlers):
        if getattr(h, "_expctl", False):
            root.removeHandler(h)
            h.close()
    root.setLevel(logging.NOTSET)
    root.propagate = True


# the cache of this test session (`expctl list`, decoded .gz datasets), not the user's
# (~/.cache/expctl), for the CLI processes and this one
LIST_CACHE = tempfile.TemporaryDirectory(prefix="expctl-list-cache-")
os.environ["EXPCTL_CACHE_DIR"] = LIST_CACHE.name


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for CLI subprocesses: test plugins importable, no inherited rank variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "TORCHELASTIC_"))
    }
    for k in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
    ):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGINS), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    env["EXPCTL_CACHE_DIR"] = LIST_CACHE.name
    env.update(extra)
    return env


class _Warm:
    """This pytest process's warm CLI server (tests/warm_cli.py), started on first use."""

    proc: subprocess.Popen[str] | None = None

    @classmethod
    def run(
        cls, args: Sequence[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        with cls.started(args, cwd, env, timeout) as child:
            return child.wait()

    @classmethod
    @contextlib.contextmanager
    def started(
        cls, args: Sequence[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> Iterator[Started]:
        if cls.proc is None or cls.proc.poll() is not None:
            clean = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
            # the expctl of this checkout, also where an editable install points elsewhere
            # (a git worktree beside the main checkout)
            clean["PYTHONPATH"] = str(REPO)
            cls.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("warm_cli.py"))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=clean,
            )
            atexit.register(cls.proc.kill)
        proc = cls.proc
        assert proc.stdin is not None and proc.stdout is not None
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            request = {
                "argv": list(args),
                "cwd": str(cwd),
                "env": env,
                "out": str(out),
                "err": str(err),
            }
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            child = Started(json.loads(proc.stdout.readline())["pid"], ["expctl", *args])
            child._end = lambda: _Warm._ended(child, out, err, timeout)
            try:
                yield child
            finally:
                if child._end is not None:  # the block ended first: the child goes with it
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(child.pid, signal.SIGKILL)
                    child.wait()

    @classmethod
    def _ended(
        cls, child: Started, out: Path, err: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        assert cls.proc is not None and cls.proc.stdout is not None
        ready, _, _ = select.select([cls.proc.stdout], [], [], timeout)
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            cls.proc.stdout.readline()
            raise subprocess.TimeoutExpired(child.args, timeout, out.read_text(), err.read_text())
        code = json.loads(cls.proc.stdout.readline())["code"]
        return subprocess.CompletedProcess(
            child.args, code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


class Started:
    """An `expctl ...` child of the warm server, still running (`expctl_started`)."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid  # also its process group's id
        self.args = args
        self.result: subprocess.CompletedProcess[str] | None = None
        self._end: Callable[[], subprocess.CompletedProcess[str]] | None = None

    def wait(self) -> subprocess.CompletedProcess[str]:
        """Its exit code (negative: killed by that signal) and output, once it has ended."""
        if self.result is None:
            end, self._end = self._end, None  # the server answers once
            assert end is not None, "it ended without a result (a timeout)"
            self.result = end()
        return self.result


def expctl_started(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> contextlib.AbstractContextManager[Started]:
    """`expctl ARGS` forked from the warm server as `expctl(...)` does, left running for the
    block: signal `.pid`, then `.wait()`; a child still running when the block ends is killed
    with its process group. The server runs one child at a time: no `expctl(...)` in the block
    before `.wait()`."""
    return _Warm.started(args, cwd, env or cli_env(), timeout)


def expctl(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m expctl ARGS` in `cwd`; fail with its output when `check` and it fails.

    The process is forked from a warm server that imported torch, Hydra and expctl once
    (tests/warm_cli.py); `fresh` starts a new interpreter, for tests of what start-up does."""
    if fresh:
        proc = subprocess.run(
            [sys.executable, "-m", "expctl", *args],
            cwd=cwd,
            env=env or cli_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    else:
        proc = _Warm.run(args, cwd, env or cli_env(), timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"expctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A small config file (.yml) on synthetic data, in a fresh working directory."""
    path = tmp_path / "tiny.yml"
    path.write_text(TINY)
    return path


NEIGHBOUR = """\
\"\"\"A user's model module beside the -C file (imports: [neighbour_models]).\"\"\"
from torch import nn

from expctl import register


@register("models", "neighbour_mlp")
def neighbour_mlp(input_shape: tuple[int, ...] = (20,), num_classes: int = 4) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], 8), nn.ReLU(), nn.Linear(8, num_classes))
"""


@pytest.fixture
def neighbour(tmp_path: Path) -> Path:
    """`project/my.yml` (TINY with `imports: [neighbour_models]` and that module's model) and
    `project/neighbour_models.py` beside it, found only as the -C file's neighbour; returns
    my.yml. `elsewhere/` is another working directory."""
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (project / "neighbour_models.py").write_text(NEIGHBOUR)
    body = TINY.replace("model: {name: mlp, hidden: [32]}", "model: {name: neighbour_mlp}")
    (project / "my.yml").write_text("imports: [neighbour_models]\n" + body)
    return project / "my.yml"


SNAPMOD = """\
\"\"\"A user's model module in a git repository: train.log says which version built the model.\"\"\"
import logging

from torch import nn

from expctl import register

VERSION = {version}


@register("models", "snap_mlp")
def snap_mlp(input_shape: tuple[int, ...] = (20,), num_classes: int = 4) -> nn.Module:
    logging.getLogger("expctl").info("snapmod version %d", VERSION)
    return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], num_classes))
"""


def git(repo: Path, *args: str) -> str:
    """Run git in `repo`; its output."""
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def user_repo(repo: Path, module: str = "snapmod") -> Path:
    """A committed git repository (branch main): tiny.yml training `snap_mlp` of `module`.py
    (SNAPMOD, version 1), listed under its imports:, and a .gitignore of runs/."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "test@example.com")
    git(repo, "config", "user.name", "test")
    (repo / f"{module}.py").write_text(SNAPMOD.format(version=1))
    body = TINY.replace("model: {name: mlp, hidden: [32]}", "model: {name: snap_mlp}")
    (repo / "tiny.yml").write_text(f"imports: [{module}]\n" + body)
    (repo / ".gitignore").write_text("runs/\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "version 1")
    return repo


def tree(root: Path) -> dict[str, tuple[int, int, bytes | None]]:
    """Every file and folder under `root` (and `root` itself, as "."): mode, mtime and contents
    (None for a folder), to show that a command changed nothing there, not even for an instant
    (a file made and removed again changes its folder's mtime)."""
    out: dict[str, tuple[int, int, bytes | None]] = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        out[str(p.relative_to(root))] = (
            st.st_mode,
            st.st_mtime_ns,
            p.read_bytes() if p.is_file() and not p.is_symlink() else None,
        )
    return out


def synthetic_accuracy(run_dir: Path, split: str = "val", **data: object) -> float:
    """The accuracy of a run's newest checkpoint on its `data=synthetic` split (`data`: other
    dataset arguments), computed here with the model and plain torch: what the run's own
    validation or `expctl eval` must report."""
    import torch

    import expctl
    from expctl.builtin.datasets.synthetic import synthetic
    from expctl.config import frozen as config

    splits = synthetic(**{**config.load(run_dir).data.args, **data})
    x, y = (splits.train if split == "train" else splits.val).tensors
    with torch.no_grad():
        predicted = expctl.load_model(run_dir, which="last")(x).argmax(1)
    return (predicted == y).sum().item() / len(y)


def wait_for(what: str, ready: Callable[[], object], timeout: float = 120) -> None:
    """Poll `ready` until it is true; fail naming `what` after `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def workers_of(run_dir: Path, rank: int | None = None) -> list[int]:
    """The live local workers (`expctl _worker RUN_DIR ...`) of a run, or of one rank of it:
    found by their command line, since torch's agent starts each in a session of its own."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        mine = b"_worker" in argv and str(run_dir).encode() in argv and state != "Z"
        if mine and (rank is None or f"RANK={rank}".encode() in environ):
            out.append(int(p))
    return out


def run_dirs(root: Path) -> list[Path]:
    """Run directories (those holding config.yaml) under `root`."""
    return sorted(p.parent for p in root.rglob("config.yaml"))


@contextlib.contextmanager
def tmpfs(path: Path, kib: int, read_only: bool = False, fill: bool = False) -> Iterator[Path]:
    """A real small filesystem at `path` (root mounts it, as in CI; skipped elsewhere): read-only,
    or filled to the last byte, for full-disk and read-only cases."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"{'ro,' if read_only else ''}size={kib}k"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        if fill:
            with contextlib.suppress(OSError), open(path / "filler", "wb") as f:
                while True:
                    f.write(b"x" * 4096)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def image_tree(root: Path, classes: int = 3, per_class: int = 12, seed: int = 0) -> Path:
    """Class-per-folder images written with Pillow: JPEG and PNG, grey, RGB, RGBA, CMYK and
    palette images of varied sizes (14-40 px), each class a different mean colour."""
    import random

    from PIL import Image

    rng = random.Random(seed)
    modes = [("RGB", "JPEG"), ("L", "JPEG"), ("CMYK", "JPEG"), ("RGBA", "PNG"), ("P", "PNG")]
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            mode, fmt = modes[(i + c) % len(modes)]
            size = (rng.randint(14, 40), rng.randint(14, 40))
            shade = 40 + 80 * c + rng.randint(-20, 20)
            image = Image.new("RGB", size, (shade, 255 - shade, (shade * 3) % 256))
            for _ in range(20):  # some texture
                x, y = rng.randrange(size[0]), rng.randrange(size[1])
                image.putpixel((x, y), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
            image = image.convert(mode)
            suffix = ".jpg" if fmt == "JPEG" else ".png"
            image.save(
                folder / f"img_{i:03d}{suffix}", fmt, **({"quality": 90} if fmt == "JPEG" else {})
            )
    return root


COMPOSE_RESNET = """
import sys
from expctl.config import compose
from expctl.errors import UserError
print(compose.compose(None, ["model=resnet18", "model.name=resnet50"]).model.args)
print("torchvision" in sys.modules)
try:  # (the error looks through every name, torchvision's included, for the key's owner)
    compose.compose(None, ["model=resnet18", "model.widht_per_group=3"])
except UserError as e:
    print(e.message)
"""


def compose_resnet(cache: Path) -> list[str]:
    """In a fresh process with EXPCTL_CACHE_DIR=cache: a torchvision model's composed arguments,
    whether torchvision got imported, and the error of a misspelled argument (three lines)."""
    proc = subprocess.run(
        [sys.executable, "-c", COMPOSE_RESNET],
        capture_output=True, text=True, env=cli_env(EXPCTL_CACHE_DIR=str(cache)), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.splitlines()
