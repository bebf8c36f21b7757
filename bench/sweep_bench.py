"""Sweeps that use the machine (issue 24): the driver's overhead, PBT against fixed learning
rates, and trials side by side on GPUs.

    python bench/sweep_bench.py overhead [--trials 64 --job-s 2]   # CPU: wall vs the ideal
    python bench/sweep_bench.py pbt [--population 4]               # CPU: PBT vs the best fixed lr
    python bench/sweep_bench.py gpu [--trials 16 --workload fashion_cnn]  # GPUs: serial, 1, 0.25

`overhead`: N trials whose job sleeps (CPU-light: what is measured is the driver, not the
trials' contention), all trials at once as the cores allow; the ideal is the sum of the trials'
own times (fork to exit, as the driver prints them) over the concurrency. `pbt`: a noisy
quadratic (a linear layer's bias fitted to targets with label noise, a noise-free validation
split: val/loss is the excess loss itself), where a large step size is best early and a small
one late; a PBT population against a grid of fixed learning rates of the same budget. `gpu`: the
same 16 trials one at a time on one GPU (the serial sweep), one GPU each, and four per GPU.
Each prints a short table and writes its JSON beside bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PLUGINS = REPO / "tests" / "plugins"
EXPCTL = [sys.executable, "-m", "expctl"]

SMALL = """\
model: {name: mlp, hidden: [8]}
data: {name: synthetic, shape: [6], num_classes: 3, num_samples: 64, val_samples: 16, batch_size: 8}
optim: {name: sgd, lr: 0.1}
sched: {name: null}
train: {max_epochs: 1, log_every: 4}
imports: [faulty]
"""


def sweep(
    cwd: Path, args: list[str], env: dict[str, str] | None = None, code: Path = REPO
) -> tuple[float, str]:
    """`expctl run -m ARGS` in `cwd` with the expctl package of `code` (a folder holding it);
    its wall time and stdout, each line prefixed with the seconds since the command started
    (`[  12.34] expctl: ...`)."""
    t0 = time.perf_counter()
    lines = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [*EXPCTL, "run", *args],
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": _path(PLUGINS, code), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(f"[{time.perf_counter() - t0:8.2f}] {line}")
        code = proc.wait()
        wall = time.perf_counter() - t0
        err.seek(0)
        if code:
            raise SystemExit(
                f"sweep failed ({code}):\n{''.join(lines)[-2000:]}\n{err.read()[-2000:]}"
            )
    return wall, "".join(lines)


def timeline(stdout: str, wall: float) -> dict[str, float]:
    """The driver's own time: from the command's start to its first trial's start, and from its
    last trial's end to its exit."""
    stamps = [(float(m[1]), m[2]) for m in re.finditer(r"^\[ *([0-9.]+)\] (.*)$", stdout, re.M)]
    starts = [t for t, text in stamps if re.search(r"trial \d+ started", text)]
    ends = [t for t, text in stamps if re.search(r"trial \d+ \w+ in [0-9.]+ s", text)]
    return {"before_first_s": round(min(starts), 2), "after_last_s": round(wall - max(ends), 2)}


def _path(*folders: Path) -> str:
    """PYTHONPATH with `folders` first (where expctl is not installed: the GPU machine)."""
    return os.pathsep.join([*map(str, folders), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )


def trial_times(stdout: str) -> list[float]:
    """Each trial's own time, fork to exit, from the driver's `trial N completed in X s` lines."""
    return [float(x) for x in re.findall(r"trial \d+ completed in ([0-9.]+) s", stdout)]


def concurrency(stdout: str) -> int:
    return int(re.search(r"expctl: (\d+) trial\(s\) at a time", stdout).group(1))  # type: ignore[union-attr]


def overhead(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        (cwd / "small.yml").write_text(SMALL)
        steps = 8  # 64 samples, batch 8: one epoch; the job sleeps job_s over them
        args = ["-C", "small.yml", "-m", f"train.seed=range(0,{a.trials})", "train.step=slow"]
        wall, out = sweep(cwd, args, {"SLOW_STEP_S": str(a.job_s / steps)})
    times = trial_times(out)
    n = concurrency(out)
    ideal = sum(times) / n
    row = {
        "trials": len(times),
        "concurrent": n,
        "trial_s_median": round(statistics.median(times), 3),
        "wall_s": round(wall, 2),
        "ideal_s": round(ideal, 2),
        "ratio": round(wall / ideal, 3),
        **timeline(out, wall),
    }
    print(
        f"{'trials':>6} {'at once':>7} {'trial s':>8} {'wall s':>7} {'ideal s':>8} {'wall/ideal':>10}"
    )
    print(
        f"{row['trials']:>6} {n:>7} {row['trial_s_median']:>8} {row['wall_s']:>7} "
        f"{row['ideal_s']:>8} {row['ratio']:>10}"
    )
    print(
        f"the driver's own: {row['before_first_s']} s before the first trial started, "
        f"{row['after_last_s']} s after the last ended"
    )
    return row


def quadratic(folder: Path, dims: int = 10, n: int = 128, noise: float = 2.0) -> Path:
    """x = 0, y = 5 + noise: the bias of `linear` is the only thing learnt, by noisy gradients
    (batches of the noisy targets); validation targets are the training targets' mean, the
    optimum, so val/loss is the bias's squared distance to it (0 is reachable)."""
    import numpy as np

    rng = np.random.default_rng(0)
    path = folder / "quadratic.npz"
    y = (5 + noise * rng.standard_normal((n, dims))).astype(np.float32)
    np.savez(
        path,
        x_train=np.zeros((n, 1), np.float32),
        y_train=y,
        x_val=np.zeros((16, 1), np.float32),
        y_val=np.repeat(y.mean(0, keepdims=True), 16, 0),
    )
    return path


PBT_TOY = """\
model: {name: linear}
data: {name: arrays, train: quadratic.npz, task: regression, standardize: false, batch_size: 4}
optim: {name: sgd, lr: 0.05}
sched: {name: null}
loss: {name: mse}
train: {max_epochs: 16, log_every: 32, step: slow}
sweep: {metric: val/loss, mode: min}
imports: [faulty]
"""


def pbt(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        quadratic(cwd)
        # each step sleeps step_s (tests/plugins/faulty.py `slow`): an epoch outlasts a copy's
        # restart, as in any real run (without it a 512-step trial takes as long as one copy)
        (cwd / "toy.yml").write_text(PBT_TOY)
        slow = {"SLOW_STEP_S": str(a.step_s)}
        lrs = [round(0.00125 * 2**i, 5) for i in range(9)]  # 0.00125 .. 0.32
        fixed_wall, fixed_out = sweep(
            cwd, ["-C", "toy.yml", "-m", f"optim.lr={','.join(map(str, lrs))}"], slow
        )
        fixed = _values(fixed_out)
        pbt_wall, pbt_out = sweep(
            cwd,
            [
                "-C",
                "toy.yml",
                "-m",
                "sweep.scheduler=pbt",
                f"sweep.n_trials={a.population}",
                f"sweep.max_concurrent={a.population}",
                f"sweep.seed={a.seed}",
                "optim.lr=tag(log, interval(0.001, 0.32))",
            ],
            slow,
        )
        population = _values(pbt_out)
        copies = len(
            re.findall(
                r"continuing from trial",
                "".join(p.read_text() for p in cwd.glob("runs/*/trial_*/output.log")),
            )
        )
    best_fixed, best_pbt = min(fixed.values()), min(population.values())
    row = {
        "fixed_lrs": lrs,
        "fixed_val_loss": fixed,
        "best_fixed": best_fixed,
        "pbt_val_loss": population,
        "best_pbt": best_pbt,
        "copies": copies,
        "ratio_best_pbt_to_best_fixed": round(best_pbt / best_fixed, 3),
        "wall_s": {"fixed": round(fixed_wall, 1), "pbt": round(pbt_wall, 1)},
    }
    print(f"{'':>12} {'trials':>6} {'best val/loss':>14} {'wall s':>7}")
    print(f"{'fixed lr':>12} {len(fixed):>6} {best_fixed:>14.5g} {fixed_wall:>7.1f}")
    print(
        f"{'pbt':>12} {len(population):>6} {best_pbt:>14.5g} {pbt_wall:>7.1f}   ({copies} copies)"
    )
    return row


def _values(stdout: str) -> dict[str, float]:
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"trial (\d+) completed in [0-9.]+ s: val/loss=([0-9.e+-]+)", stdout)
    }


DATA_ROOT = os.environ.get("EXPCTL_BENCH_DATA", "/usr/share/datasets/fashion-mnist")
WORKLOADS = {
    # the Fashion-MNIST CNN preset as it is (3 epochs); ResNet-18 on 32x32 synthetic images, as
    # many epochs (until stop 33 both ran 1 epoch: `--epochs 1` is that workload)
    "fashion_cnn": ["experiment=default", f"data.root={DATA_ROOT}"],
    "resnet18_32": [
        "model=resnet18",
        "data=synthetic",
        "data.shape=[3,32,32]",
        "data.num_classes=10",
        "data.num_samples=16384",
        "data.val_samples=1024",
        "data.batch_size=256",
        "train.max_epochs=3",
    ],
    "smoke": [
        "data=synthetic",
        "data.shape=[6]",
        "data.num_samples=64",
        "data.batch_size=8",
        "model=mlp",
        "train.max_epochs=1",
    ],
}


def gpu(a: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        base = [*WORKLOADS[a.workload], f"train.seed=range(0,{a.trials})", "train.log_every=50"]
        if a.epochs:
            base.append(f"train.max_epochs={a.epochs}")
        settings = {
            "serial": ("serial, 1 GPU", ["sweep.max_concurrent=1"], {"CUDA_VISIBLE_DEVICES": "0"}),
            "one": ("1 GPU each", ["sweep.gpus_per_trial=1"], {}),
            "quarter": ("0.25 GPU each", ["sweep.gpus_per_trial=0.25"], {}),
            # packed trials with cuDNN's autotuner on, as before stop 35 (now off when shared)
            "quarter_tuned": (
                "0.25, autotuned",
                ["sweep.gpus_per_trial=0.25"],
                {"EXPCTL_CUDNN_BENCHMARK": "1"},
            ),
        }
        for key in a.settings.split(","):
            # KEY@before: with the expctl package under $EXPCTL_BENCH_BEFORE (an older version)
            setting, _, which = key.partition("@")
            label, extra, env = settings[setting]
            code = Path(os.environ["EXPCTL_BENCH_BEFORE"]) if which == "before" else REPO
            label += " (before)" if which == "before" else ""
            wall, out = sweep(cwd, ["-m", *base, *extra], env, code)
            samples, train_s = _samples(cwd)
            phases = {**_phases(cwd), **timeline(out, wall)}
            rows.append(
                {
                    "setting": label,
                    "key": key,
                    "concurrent": concurrency(out),
                    "wall_s": round(wall, 1),
                    "samples_per_s": round(samples / wall, 1),
                    # a trial as the driver saw it (process start to end) and its training alone:
                    # the difference is its start-up (interpreter, CUDA, data) and final test
                    "trial_s_median": round(statistics.median(trial_times(out)), 2),
                    "train_s_median": round(statistics.median(train_s), 2),
                    **phases,
                }
            )
    first = rows[0]
    print(
        f"{'setting':>14} {'at once':>7} {'wall s':>7} {'samples/s':>10} {'vs ' + first['key']:>10} "
        f"{'trial s':>8} {'train s':>8}"
    )
    for r in rows:
        print(
            f"{r['setting']:>14} {r['concurrent']:>7} {r['wall_s']:>7} {r['samples_per_s']:>10} "
            f"{first['wall_s'] / r['wall_s']:>9.2f}x {r['trial_s_median']:>8} {r['train_s_median']:>8}"
        )
    print(
        "s: the driver's start -> first trial started | last trial ended -> exit; a trial's "
        "medians: config frozen -> its first log line (fork, CUDA, data, model) | -> first "
        "logged step | last logged step -> result written"
    )
    for r in rows:
        print(
            f"{r['setting']:>14} {r['before_first_s']:>6} {r['after_last_s']:>6} | "
            f"{r['setup_s']:>6} {r['first_steps_s']:>6} {r['end_s']:>6}"
        )
    by = {r["key"]: r for r in rows}
    for code in ("", "@before"):
        if f"serial{code}" in by and f"one{code}" in by:
            ratio = by[f"one{code}"]["wall_s"] / by[f"serial{code}"]["wall_s"]
            print(f"wall(1 GPU each)/wall(serial){code} = {ratio:.3f} (target <= 0.3)")
        for quarter in (f"quarter{code}", "quarter_tuned"):
            if quarter in by and f"one{code}" in by:
                ratio = by[quarter]["samples_per_s"] / by[f"one{code}"]["samples_per_s"]
                print(f"samples/s({quarter})/samples/s(one{code}) = {ratio:.2f} (target >= 2)")
    return {"workload": a.workload, "trials": a.trials, "epochs": a.epochs, "rows": rows}


def _phases(cwd: Path) -> dict[str, float]:
    """Where a trial's time outside training goes, from its files' times (medians): its config
    frozen by the driver -> its run's first log line (the process, CUDA, data, model) -> its first
    logged step -> its last logged step -> its result.json."""
    newest = max(cwd.glob("runs/*sweep*"), key=lambda p: p.stat().st_mtime)
    setup, first, end = [], [], []
    for trial in newest.glob("trial_*"):
        line = (trial / "train.log").read_text().splitlines()[0]
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        rows = [json.loads(x) for x in (trial / "metrics.jsonl").read_text().splitlines()]
        times = [r["time"] for r in rows if "time" in r]
        setup.append(stamp - (trial / "config.yaml").stat().st_mtime)
        first.append(times[0] - stamp)
        end.append((trial / "result.json").stat().st_mtime - times[-1])
    return {
        "setup_s": round(statistics.median(setup), 2),
        "first_steps_s": round(statistics.median(first), 2),
        "end_s": round(statistics.median(end), 2),
    }


def _samples(cwd: Path) -> tuple[float, list[float]]:
    """Training samples of the newest sweep's trials (steps x global batch, from result.json and
    config.yaml), for the aggregate throughput; and each trial's training seconds."""
    import yaml

    newest = max(cwd.glob("runs/*sweep*"), key=lambda p: p.stat().st_mtime)
    total, train_s = 0.0, []
    for trial in newest.glob("trial_*"):
        result = json.loads((trial / "result.json").read_text())
        cfg = yaml.safe_load((trial / "config.yaml").read_text())
        ranks = cfg["launcher"].get("nproc", 1) if cfg["launcher"]["name"] == "local" else 1
        total += result["step"] * cfg["data"]["batch_size"] * ranks
        train_s.append(float(result.get("time/train_s", 0.0)))
    return total, train_s


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--trials", type=int, default=64)
    o.add_argument("--job-s", type=float, default=2.0)
    b = sub.add_parser("pbt")
    b.add_argument("--population", type=int, default=4)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--step-s", type=float, default=0.02, help="seconds each step sleeps")
    g = sub.add_parser("gpu")
    g.add_argument("--trials", type=int, default=16)
    g.add_argument("--workload", choices=sorted(WORKLOADS), default="fashion_cnn")
    g.add_argument("--epochs", type=int, default=0, help="train.max_epochs (0: the workload's)")
    g.add_argument(
        "--settings",
        default="serial,one,quarter",
        help="which, in this order (also quarter_tuned; KEY@before: $EXPCTL_BENCH_BEFORE's code)",
    )
    for q in (o, b, g):
        q.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    if a.what == "overhead" and (a.trials < 1 or a.job_s <= 0):
        raise SystemExit("--trials must be >= 1 and --job-s > 0")
    row = {"overhead": overhead, "pbt": pbt, "gpu": gpu}[a.what](a)
    out = a.out or HERE / "results" / f"sweep_{a.what}_{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"argv": sys.argv, "result": row}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
