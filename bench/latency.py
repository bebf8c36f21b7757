"""How long the CLI takes to answer, and what it loads: one table, min / median / max over N runs.

    python bench/latency.py --repeats 7                             # this checkout
    python bench/latency.py --repeats 7 --before /tmp/base          # and another checkout
    python bench/latency.py --repeats 9 --before /work/main/.venv --first   # another venv, and
                                                                    # "the first time" too

Each command runs in a fresh interpreter (as a user's shell starts it); the codes compared take
turns, command by command, in alternating order, so drift and the neighbours' load hit both alike.
`--before` / `--after` name a checkout (its `expctl/` runs with this interpreter, first on
PYTHONPATH), a virtual environment or its python / expctl executable (its own install runs).

What is set up once: a finished tiny run, a 2-trial sweep and a project of `--project` runs (copies
of the tiny run with different settings, for `expctl runs`). "warm": each code's cache folder
(EXPCTL_CACHE_DIR) filled by one untimed call of every command, expctl's modules compiled.
"first" (`--first`): the first time after installing, for the read-only commands: each run gets
an empty cache folder and a copy of expctl's package without its compiled modules (and writes
none), as an editable install leaves it; a background process a command starts (the components'
description) is stopped before the next run.

Columns: wall seconds (min / median / max), CPU seconds of the process (median: what the
neighbours' load inflates least), whether torch was imported (how many runs), peak RSS. The load
average before and after is printed under the table. `run (tiny)` is a whole inline run of a
2-step MLP on synthetic data; `run: first step` is process start to the first training step of
the default job, timed after one untimed run that fills the cache of decoded Fashion-MNIST. The
baselines are a bare interpreter, `import torch`, and `import torch` plus one optimizer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = """\
model: {name: mlp, hidden: [32]}
data: {name: synthetic, shape: [20], num_classes: 4, num_samples: 512, val_samples: 128, batch_size: 32}
optim: {name: sgd, lr: 0.1, momentum: 0.9}
sched: {name: null}
train: {max_epochs: 2, log_every: 4}
"""
# what the process loaded, printed as it ends: whether torch was imported, its peak RSS in KB
EPILOGUE = (
    "import resource, sys; print('\\n@torch=' + str('torch' in sys.modules) + ' @rss=' + "
    "str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss), file=sys.stderr)"
)
# `python -m expctl ARGV`, then the epilogue
WRAPPER = f"""\
import runpy, sys
sys.argv = ["expctl", *sys.argv[1:]]
try:
    runpy.run_module("expctl", run_name="__main__")
except SystemExit as e:
    if e.code:
        raise
finally:
    {EPILOGUE}
"""
BASELINES = {
    "python -c pass": "pass",
    "python -c 'import torch'": "import torch",
    "import torch + one optimizer": "import torch; torch.optim.SGD([torch.zeros(1, requires_grad=True)])",
}
FIRST_STEP = "expctl run: start to first step (default job)"


@dataclass
class Sample:
    wall: float
    cpu: float
    torch: bool
    rss_mb: float


@dataclass
class Code:
    """One version of expctl: the interpreter that runs it and what it puts on PYTHONPATH."""

    label: str
    python: str
    path: str | None  # a checkout's root, first on PYTHONPATH; None: the environment's own
    package: Path | None = None  # its expctl/ folder (found by `prepare`)

    def env(self, cache: Path, path: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        where = path or self.path
        if where:
            env["PYTHONPATH"] = where
        env["EXPCTL_CACHE_DIR"] = str(cache)
        return env

    def cmd(self, args: list[str]) -> list[str]:
        return [self.python, "-c", WRAPPER, *args]


def code_of(label: str, where: str) -> Code:
    """A checkout (a folder holding expctl/), a virtual environment, or its python or expctl."""
    p = Path(where).expanduser().absolute()
    if (p / "expctl" / "__init__.py").is_file():
        return Code(label, sys.executable, str(p))
    if (p / "bin" / "python").exists():
        return Code(label, str(p / "bin" / "python"), None)
    if p.is_file() and p.parent.name == "bin":  # .venv/bin/python or .venv/bin/expctl
        return Code(label, str(p.parent / "python"), None)
    sys.exit(f"latency.py: {where} is no checkout, virtual environment or its executable")


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[Sample, str]:
    """Wall and CPU seconds, whether torch was imported, peak RSS in MB; and stdout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # its CPU time with it
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[-4:])} exited {proc.returncode}:\n{stderr[-3000:]}")
    found = re.search(r"@torch=(\w+) @rss=(\d+)", stderr)
    assert found, stderr[-2000:]
    cpu = usage.ru_utime + usage.ru_stime
    return Sample(wall, cpu, found.group(1) == "True", int(found.group(2)) / 1024), stdout


def first_step(code: Code, cache: Path, cwd: Path, n: int) -> Sample:
    """Process start to the default job's first training step (its metrics.jsonl time stamp)."""
    run_dir = cwd / f"first-{code.label}-{n}-{time.time_ns()}"
    t0 = time.time()
    args = ["run", "train.max_steps=1", "train.log_every=1", f"run.dir={run_dir}"]
    sample, _ = measure(code.cmd(args), code.env(cache), cwd)
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    first = next(json.loads(x) for x in rows if '"train/loss"' in x)
    shutil.rmtree(run_dir, ignore_errors=True)
    sample.wall = first["time"] - t0
    return sample


def prepare(code: Code, cache: Path, cwd: Path, runs: int) -> str:
    """A finished tiny run, a finished 2-trial sweep and `runs` runs under project/."""
    (cwd / "tiny.yml").write_text(TINY)
    measure(code.cmd(["run", "-C", "tiny.yml", "run.dir=run"]), code.env(cache), cwd)
    _, out = measure(
        code.cmd(["run", "-C", "tiny.yml", "-m", "optim.lr=0.01,0.1", "train.max_steps=4"]),
        code.env(cache),
        cwd,
    )
    found = re.search(r"sweep directory (\S+)", out)
    assert found, out
    project(cwd / "run", cwd / "project", runs)
    return found.group(1)


def project(run: Path, root: Path, n: int) -> None:
    """`n` copies of `run` with different settings (learning rate, seed, width, batch size,
    every fourth with Adam) and metrics: what `expctl runs` reads in a project."""
    import yaml

    rng = random.Random(0)
    config = yaml.safe_load((run / "config.yaml").read_text())
    result = json.loads((run / "result.json").read_text())
    for i in range(n):
        copy = root / f"r{i:03d}"
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("checkpoints", "*.lock"))
        c = json.loads(json.dumps(config))
        c["run"]["dir"] = str(copy)
        c["optim"]["lr"] = round(10 ** rng.uniform(-3, -1), 5)
        c["train"]["seed"] = i
        c["model"]["hidden"] = [32 * (1 + i % 3)]
        c["data"]["batch_size"] = (16, 32, 64)[i % 3]
        if i % 4 == 0:
            c["optim"] = {"name": "adam", "lr": c["optim"]["lr"], "betas": [0.9, 0.999]}
        (copy / "config.yaml").write_text(yaml.safe_dump(c, sort_keys=False))
        r = dict(result)
        for k in [k for k in r if k.startswith(("val/", "train/"))]:
            r[k] = round(rng.uniform(0.1, 0.9), 4)
        (copy / "result.json").write_text(json.dumps(r))


def commands(sweep: str, cwd: Path) -> dict[str, list[str]]:
    """Label -> argv; the read-only ones first (those `--first` times)."""
    return {
        "expctl --help": ["--help"],
        "expctl --version": ["--version"],
        "expctl run --help": ["run", "--help"],
        "expctl completion bash": ["completion", "bash"],
        "expctl completion zsh": ["completion", "zsh"],
        "expctl list models": ["list", "models"],
        "expctl list": ["list"],
        "expctl show": ["show"],
        "expctl show data=synthetic": ["show", "data=synthetic", "model=resnet18"],
        "expctl status RUN": ["status", "run"],
        "expctl diff RUN RUN2": ["diff", "run", "project/r001"],
        "expctl runs PROJECT": ["runs", "project"],
        "expctl sweep table SWEEP": ["sweep", "table", sweep],
        "expctl run (tiny, inline, whole run)": [
            "run",
            "-C",
            "tiny.yml",
            "train.max_steps=2",
            f"run.root={cwd / 'tiny-runs'}",
        ],
    }


def read_only(label: str) -> bool:
    return not label.startswith("expctl run (")


def cold_copy(code: Code, into: Path) -> str:
    """expctl's package (and a checkout's conf/ beside it) without compiled modules."""
    assert code.package is not None
    into.mkdir(parents=True)
    shutil.copytree(code.package, into / "expctl", ignore=shutil.ignore_patterns("__pycache__"))
    conf = code.package.parent / "conf"
    if conf.is_dir():  # the built-in configs of a checkout that keeps them beside the package
        shutil.copytree(conf, into / "conf", ignore=shutil.ignore_patterns("__pycache__"))
    return str(into)


def stop_describers(cache: Path) -> None:
    """Stop what a first-time command left running in the background (the description of the
    components: its lock file names it), so that it does not load the next run's machine."""
    for lock in cache.glob("*.lock"):
        try:
            pid = int(lock.read_text() or 0)
        except (OSError, ValueError):
            continue
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                continue
            for _ in range(100):  # up to 5 s for it to go
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--before", help="another version: a checkout, a venv or its executable")
    p.add_argument("--after", default=str(REPO), help="default: this checkout")
    p.add_argument("--first", action="store_true", help="also the first time after installing")
    p.add_argument("--project", type=int, default=77, help="runs under project/ (expctl runs)")
    p.add_argument("--only", default="", help="commands whose label contains this")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    codes = [code_of("after", args.after)] + (
        [code_of("before", args.before)] if args.before else []
    )
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="expctl-latency-") as tmp:
        samples = run_all(codes, Path(tmp), args)
    rows = [summary(name, label, runs) for (name, label), runs in samples.items()]
    print(table(rows, args.repeats, load, os.getloadavg()))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


def run_all(
    codes: list[Code], cwd: Path, args: argparse.Namespace
) -> dict[tuple[str, str], list[Sample]]:
    caches = {c.label: cwd / f"cache-{c.label}" for c in codes}
    sweep = prepare(codes[0], caches[codes[0].label], cwd, args.project)
    for c in codes:
        c.package = Path(
            subprocess.run(
                [c.python, "-c", "import expctl, os; print(os.path.dirname(expctl.__file__))"],
                env=c.env(caches[c.label]),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    timed = {k: v for k, v in commands(sweep, cwd).items() if args.only in k}
    samples: dict[tuple[str, str], list[Sample]] = {}
    for c in codes:  # warm: caches filled (`list` waits for the description), modules compiled
        for argv in [*timed.values(), ["list"]]:
            measure(c.cmd(argv), c.env(caches[c.label]), cwd)
    first = args.only in FIRST_STEP
    if first:
        for c in codes:
            first_step(c, caches[c.label], cwd, -1)  # fills idx.py's cache of decoded files
    for n in range(args.repeats):
        for name, code in BASELINES.items():
            if args.only in name:
                sample, _ = measure(
                    [sys.executable, "-c", f"{code}\n{EPILOGUE}"], dict(os.environ), cwd
                )
                samples.setdefault((name, "-"), []).append(sample)
        turn = codes if n % 2 == 0 else codes[::-1]
        for name, argv in timed.items():
            for c in turn:
                sample, _ = measure(c.cmd(argv), c.env(caches[c.label]), cwd)
                samples.setdefault((name, c.label), []).append(sample)
        if first:
            for c in turn:
                samples.setdefault((FIRST_STEP, c.label), []).append(
                    first_step(c, caches[c.label], cwd, n)
                )
        if args.first:
            for name, argv in timed.items():
                if read_only(name):
                    for c in turn:
                        samples.setdefault((name, f"{c.label}, first"), []).append(
                            first_time(c, argv, cwd, f"{n}-{name}")
                        )
    return samples


def first_time(code: Code, argv: list[str], cwd: Path, tag: str) -> Sample:
    """One run as the first after installing: an empty cache folder, expctl uncompiled."""
    where = cwd / "first" / re.sub(r"\W+", "-", f"{code.label}-{tag}")
    cache = where / "cache"
    env = code.env(cache, cold_copy(code, where / "code"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        sample, _ = measure(code.cmd(argv), env, cwd)
    finally:
        stop_describers(cache)
    shutil.rmtree(where, ignore_errors=True)
    return sample


def summary(name: str, label: str, runs: list[Sample]) -> dict[str, object]:
    walls = [r.wall for r in runs]
    return {
        "command": name,
        "code": label,
        "n": len(runs),
        "min_s": min(walls),
        "median_s": statistics.median(walls),
        "max_s": max(walls),
        "cpu_median_s": statistics.median(r.cpu for r in runs),
        "torch": sum(r.torch for r in runs),  # how many of the runs imported it
        "rss_mb": max(r.rss_mb for r in runs),
    }


def table(
    rows: list[dict[str, object]],
    repeats: int,
    load: tuple[float, ...],
    after: tuple[float, ...],
) -> str:
    """Markdown, one row per command and code."""
    lines = [
        "| command | code | n | min s | median s | max s | CPU s (median) | torch | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (str(r["command"]), str(r["code"]))):
        lines.append(
            f"| {r['command']} | {r['code']} | {r['n']} | {r['min_s']:.2f} | "
            f"{r['median_s']:.2f} | {r['max_s']:.2f} | {r['cpu_median_s']:.2f} | "
            f"{_count(r['torch'], r['n'])} | {r['rss_mb']:.0f} |"
        )
    loads = f"load average {'/'.join(f'{x:.1f}' for x in load)} before, "
    loads += f"{'/'.join(f'{x:.1f}' for x in after)} after (1/5/15 min)"
    return "\n".join(lines) + f"\n\n({repeats} repeats, {os.cpu_count()} CPUs; {loads})"


def _count(k: object, n: object) -> str:
    return "no" if k == 0 else "yes" if k == n else f"{k} of {n}"


if __name__ == "__main__":
    main()
