"""Run the same training three ways and print one table: expctl, a raw DDP script, Lightning.

    python bench/harness.py --suite cpu            # MLP and CNN, 1 and 2 gloo workers
    python bench/harness.py --suite gpu            # ResNet-18 3x32x32 and the Fashion CNN, 1-2 GPUs
    python bench/harness.py --suite cpu --smoke    # seconds-long, what the tests run

Same model, data, global batch and precision for all three; the first --warmup steps are not
timed; each cell is the median of --repeats runs made in this one invocation, so the ratios
compare like with like. expctl's throughput comes from its own metrics.jsonl (the time stamps of
its train events at steps W and S); the others print theirs. Results go to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_ROOT = os.environ.get("EXPCTL_BENCH_DATA", "/usr/share/datasets/fashion-mnist")
GPU_COUNTS = [int(n) for n in os.environ.get("EXPCTL_BENCH_GPUS", "1,2,4,8").split(",")]


@dataclass
class Workload:
    name: str
    model: str
    nproc: int
    batch: int  # per worker
    steps: int
    warmup: int
    data: str = "synthetic"
    shape: str = "1x28x28"
    precision: str = "32"
    samples: int = 16384
    lightning: bool = True
    raw_variants: dict[str, list[str]] = field(default_factory=lambda: {"raw": []})


def suites(smoke: bool) -> dict[str, list[Workload]]:
    s = 4 if smoke else 1  # smoke: 4x fewer steps
    cpu = [
        Workload("cpu mlp 1w", "mlp", 1, 128, 400 // s, 100 // s),
        Workload("cpu mlp 2w", "mlp", 2, 128, 400 // s, 100 // s),
        Workload("cpu cnn 1w", "cnn", 1, 64, 120 // s, 40 // s),
        Workload("cpu cnn 2w", "cnn", 2, 64, 120 // s, 40 // s),
    ]
    loaders = {"raw": ["--loader", "dataloader"], "raw-tensor": ["--loader", "tensor"]}
    for w in cpu:
        w.raw_variants = loaders
    gpu_raw = {
        "raw (channels_last)": ["--channels-last", "--workers", "4"],
        "raw (no channels_last)": ["--workers", "4"],
    }

    def resnet(n: int, **kw: Any) -> Workload:  # ResNet-18, CIFAR-shaped synthetic data, bf16
        return Workload(
            f"gpu resnet18 {n}g",
            "resnet18",
            n,
            512,
            300,
            60,
            shape="3x32x32",
            precision="bf16",
            samples=65536,
            **kw,
        )

    cl_only = {"raw (channels_last)": gpu_raw["raw (channels_last)"]}
    gpu = [resnet(n, raw_variants=gpu_raw) for n in (1, 2)] + [
        Workload(
            f"gpu fashion-cnn {n}g",
            "cnn",
            n,
            512,
            300,
            60,
            data="fashion",
            precision="bf16",
            raw_variants=cl_only,
        )
        for n in (1, 2)
    ]
    scaling = [resnet(n, lightning=False, raw_variants=cl_only) for n in GPU_COUNTS]
    return {"cpu": cpu, "gpu": gpu, "scaling": scaling}


def _run(
    cmd: list[str], env: dict[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:6])}... exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return proc


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


def run_expctl(w: Workload, root: Path, env: dict[str, str], extra: list[str]) -> float:
    run_dir = root / f"expctl-{w.name.replace(' ', '_')}-{time.time_ns()}"
    data = (
        ["data=fashion_mnist", f"data.root={DATA_ROOT}"]
        if w.data == "fashion"
        else [
            "data=synthetic",
            f"data.shape=[{w.shape.replace('x', ',')}]",
            f"data.num_samples={w.samples}",
            "data.val_samples=512",
        ]
    )
    overrides = [
        f"model={w.model}",
        *data,
        "optim=sgd",
        "sched=none",
        f"data.batch_size={w.batch}",
        f"train.precision={w.precision}",
        f"train.max_steps={w.steps}",
        f"train.log_every={w.warmup}",
        "train.val_every=1000",
        "train.max_epochs=100000",
        "checkpoint.every=1000000",
        f"run.dir={run_dir}",
        *extra,
    ]
    if w.nproc > 1:
        overrides += ["launcher=local", f"launcher.nproc={w.nproc}"]
    _run([sys.executable, "-m", "expctl", "run", *overrides], env)
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if "train/loss" in e]
    first = next(e for e in train if e["step"] == w.warmup)
    last = train[-1]
    shutil.rmtree(run_dir, ignore_errors=True)
    return (last["step"] - first["step"]) * w.batch * w.nproc / (last["time"] - first["time"])


def _base_args(w: Workload) -> list[str]:
    return [
        "--model",
        w.model,
        "--data",
        w.data,
        "--root",
        DATA_ROOT,
        "--shape",
        w.shape,
        "--samples",
        str(w.samples),
        "--batch",
        str(w.batch),
        "--steps",
        str(w.steps),
        "--warmup",
        str(w.warmup),
        "--precision",
        w.precision,
    ]


def run_raw(w: Workload, env: dict[str, str], variant: list[str]) -> float:
    script = [str(HERE / "raw_ddp.py"), *_base_args(w), *variant]
    if w.nproc > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={w.nproc}",
            *script,
        ]
    else:
        cmd = [sys.executable, *script]
    return float(_json_line(_run(cmd, env).stdout)["samples_per_s"])


def run_lightning(w: Workload, env: dict[str, str], root: Path) -> float:
    cmd = [
        sys.executable,
        str(HERE / "lightning_bench.py"),
        *_base_args(w),
        "--devices",
        str(w.nproc),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return float(_json_line(proc.stdout)["samples_per_s"])


def lightning_available() -> bool:
    code = "import importlib.util as u; print(bool(u.find_spec('lightning') or u.find_spec('pytorch_lightning')))"
    return (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
        == "True"
    )


def startup(env: dict[str, str], root: Path, repeats: int) -> dict[str, float]:
    """`expctl --help` wall time, and process start to the first training step of the default job."""
    helps, firsts = [], []
    for i in range(repeats):
        t = time.perf_counter()
        _run([sys.executable, "-m", "expctl", "--help"], env)
        helps.append(time.perf_counter() - t)
        run_dir = root / f"first-{i}"
        t0 = time.time()
        _run(
            [
                sys.executable,
                "-m",
                "expctl",
                "run",
                "train.max_steps=1",
                "train.log_every=1",
                f"run.dir={run_dir}",
            ],
            env,
        )
        first = next(
            json.loads(x)
            for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"train/loss"' in x
        )
        firsts.append(first["time"] - t0)
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"help_s": statistics.median(helps), "first_step_s": statistics.median(firsts)}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--suite",
        choices=("cpu", "gpu", "scaling"),
        default="cpu",
        help="scaling: ResNet-18 on EXPCTL_BENCH_GPUS (default 1,2,4,8) GPUs, expctl and raw",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--smoke", action="store_true", help="short runs, one repeat (used by the tests)"
    )
    p.add_argument("--only", default="", help="run workloads whose name contains this")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--expctl-args", default="", help="extra expctl overrides, space separated")
    args = p.parse_args()
    repeats = 1 if args.smoke else args.repeats
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    has_lightning = lightning_available()
    results: dict[str, Any] = {"suite": args.suite, "repeats": repeats, "rows": []}
    with tempfile.TemporaryDirectory(prefix="expctl-bench-") as tmp:
        root = Path(tmp)
        if args.suite == "cpu" and not args.only:
            results["startup"] = startup(env, root, repeats)
        for w in suites(args.smoke)[args.suite]:
            if args.only and args.only not in w.name:
                continue
            row: dict[str, Any] = {"workload": w.name, "batch": w.batch, "precision": w.precision}
            runs: dict[str, list[float]] = {"expctl": []}
            for _ in range(repeats):  # interleaved, so drift hits every contender alike
                runs["expctl"].append(run_expctl(w, root, env, args.expctl_args.split()))
                for label, variant in w.raw_variants.items():
                    runs.setdefault(label, []).append(run_raw(w, env, variant))
                if has_lightning and w.lightning:
                    runs.setdefault("lightning", []).append(run_lightning(w, env, root))
            row.update({k: statistics.median(v) for k, v in runs.items()})
            row["runs"] = runs
            results["rows"].append(row)
            print(format_row(row), flush=True)
    print()
    print(format_table(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


def format_row(row: dict[str, Any]) -> str:
    cells = [f"{k}={v:,.0f}/s" for k, v in row.items() if isinstance(v, float)]
    return f"{row['workload']:<22} " + "  ".join(cells)


def format_table(results: dict[str, Any]) -> str:
    """Markdown: samples/s per contender, and expctl's ratio to each."""
    names: list[str] = []
    for row in results["rows"]:
        names += [k for k, v in row.items() if isinstance(v, float) and k not in names]
    others = [n for n in names if n != "expctl"]
    head = (
        "| workload | "
        + " | ".join(f"{n} samples/s" for n in names)
        + " | "
        + " | ".join(f"expctl / {n}" for n in others)
        + " |"
    )
    lines = [head, "|" + "---|" * (1 + len(names) + len(others))]
    for row in results["rows"]:
        cells = [f"{row[n]:,.0f}" if n in row else "-" for n in names]
        ratios = [f"{row['expctl'] / row[n]:.3f}" if n in row else "-" for n in others]
        lines.append(f"| {row['workload']} | " + " | ".join(cells + ratios) + " |")
    if "startup" in results:
        s = results["startup"]
        lines.append(
            f"\n`expctl --help`: {s['help_s']:.3f} s; start to first training step (default job): {s['first_step_s']:.2f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
