"""How long the CLI takes to answer, and what it loads: one table, min / median / max over N runs.

    python bench/latency.py --repeats 7                      # this checkout
    python bench/latency.py --repeats 7 --before /tmp/base   # and another checkout, interleaved

Each command runs in a fresh interpreter (as a user's shell starts it), with a small run and a
2-trial sweep made once beforehand; "torch" says whether the command imported it, RSS is the
process's peak. `run (tiny)` is a whole inline run of a 2-step MLP on synthetic data; `run: first
step` is process start to the first training step of the default job (harness.startup's figure),
timed after one untimed run that fills the cache of decoded Fashion-MNIST (also reported).
The baselines are a bare interpreter, `import torch`, and `import torch` plus one optimizer
(torch.optim imports torch._dynamo on the first optimizer built, for any script).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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


def measure(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bool, float, str]:
    """Wall seconds, whether torch was imported, peak RSS in MB, stdout."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[-4:])} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    found = re.search(r"@torch=(\w+) @rss=(\d+)", proc.stderr)
    assert found, proc.stderr[-2000:]
    return wall, found.group(1) == "True", int(found.group(2)) / 1024, proc.stdout


def expctl_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-c", WRAPPER, *args]


def first_step(env: dict[str, str], cwd: Path, n: int) -> tuple[float, bool, float, str]:
    """Process start to the default job's first training step (its metrics.jsonl time stamp)."""
    run_dir = cwd / f"first-{n}-{time.time_ns()}"
    t0 = time.time()
    _, torch, rss, out = measure(
        expctl_cmd(["run", "train.max_steps=1", "train.log_every=1", f"run.dir={run_dir}"]),
        env,
        cwd,
    )
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    first = next(json.loads(x) for x in rows if '"train/loss"' in x)
    shutil.rmtree(run_dir, ignore_errors=True)
    return first["time"] - t0, torch, rss, out


def prepare(env: dict[str, str], cwd: Path) -> tuple[str, str]:
    """A finished tiny run and a finished 2-trial sweep (made with this checkout)."""
    (cwd / "tiny.yml").write_text(TINY)
    measure(expctl_cmd(["run", "-C", "tiny.yml", "run.dir=run"]), env, cwd)
    _, _, _, out = measure(
        expctl_cmd(["run", "-C", "tiny.yml", "-m", "optim.lr=0.01,0.1", "train.max_steps=4"]),
        env,
        cwd,
    )
    found = re.search(r"sweep directory (\S+)", out)
    assert found, out
    return "run", found.group(1)


def commands(sweep: str, cwd: Path) -> dict[str, list[str]]:
    return {
        "expctl --help": ["--help"],
        "expctl status RUN": ["status", "run"],
        "expctl sweep table SWEEP": ["sweep", "table", sweep],
        "expctl list models": ["list", "models"],
        "expctl show": ["show"],
        "expctl run (tiny, inline, whole run)": [
            "run",
            "-C",
            "tiny.yml",
            "train.max_steps=2",
            f"run.root={cwd / 'tiny-runs'}",
        ],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--before", help="another checkout, timed in the same invocation (interleaved)")
    p.add_argument("--only", default="", help="commands whose label contains this")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    trees = {"after": REPO} | ({"before": Path(args.before).resolve()} if args.before else {})
    with tempfile.TemporaryDirectory(prefix="expctl-latency-") as tmp:
        cwd = Path(tmp)
        envs = {
            label: {
                **os.environ,
                "PYTHONPATH": str(tree),
                "EXPCTL_CACHE_DIR": str(cwd / f"cache-{label}"),
            }
            for label, tree in trees.items()
        }
        _, sweep = prepare(envs["after"], cwd)
        cold = measure(expctl_cmd(["list", "models"]), envs["after"], cwd)  # fills the cache
        first = args.only in "expctl run: start to first step"
        cold_data = first_step(envs["after"], cwd, -1) if first else None  # fills idx.py's cache
        timed = {k: v for k, v in commands(sweep, cwd).items() if args.only in k}
        samples: dict[tuple[str, str], list[tuple[float, bool, float]]] = {}
        for n in range(args.repeats):  # interleaved: drift and the neighbours' load hit all alike
            for label, env in envs.items():
                for name, code in BASELINES.items():
                    if args.only in name and label == "after":
                        samples.setdefault((name, "-"), []).append(
                            measure([sys.executable, "-c", f"{code}\n{EPILOGUE}"], env, cwd)[:3]
                        )
                for name, argv in timed.items():
                    samples.setdefault((name, label), []).append(
                        measure(expctl_cmd(argv), env, cwd)[:3]
                    )
                if first:
                    key = ("expctl run: start to first step (default job)", label)
                    samples.setdefault(key, []).append(first_step(env, cwd, n)[:3])
        samples[("expctl list models (empty cache: made once)", "after")] = [cold[:3]]
        if cold_data is not None:
            key = ("expctl run: first step, empty data cache (made once)", "after")
            samples[key] = [cold_data[:3]]
    rows = [summary(name, label, runs) for (name, label), runs in samples.items()]
    print(table(rows, args.repeats))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


def summary(name: str, label: str, runs: list[tuple[float, bool, float]]) -> dict[str, object]:
    walls = [r[0] for r in runs]
    return {
        "command": name,
        "code": label,
        "n": len(runs),
        "min_s": min(walls),
        "median_s": statistics.median(walls),
        "max_s": max(walls),
        "torch": sum(r[1] for r in runs),  # how many of the runs imported it
        "rss_mb": max(r[2] for r in runs),
    }


def table(rows: list[dict[str, object]], repeats: int) -> str:
    """Markdown, one row per command and checkout."""
    lines = [
        "| command | code | n | min s | median s | max s | torch | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (str(r["command"]), str(r["code"]))):
        lines.append(
            f"| {r['command']} | {r['code']} | {r['n']} | {r['min_s']:.2f} | "
            f"{r['median_s']:.2f} | {r['max_s']:.2f} | {_count(r['torch'], r['n'])} | "
            f"{r['rss_mb']:.0f} |"
        )
    return "\n".join(lines) + f"\n\n({repeats} repeats, {os.cpu_count()} CPUs)"


def _count(k: object, n: object) -> str:
    return "no" if k == 0 else "yes" if k == n else f"{k} of {n}"


if __name__ == "__main__":
    main()
