"""expctl against a plain DDP loop on the same model, the same tensors and the same data path.

    python bench/harness.py --suite cpu --repeats 5     # MLP and CNN, 1 and 2 gloo workers
    python bench/harness.py --suite gpu                 # four workloads at 1, 2, 4 GPUs, MFU
    python bench/harness.py --suite compile             # eager vs torch.compile, warm-up and gain
    python bench/harness.py --suite cpu --smoke         # seconds-long, what the tests run

Contenders: `expctl` (`expctl run ...`, throughput from its own metrics.jsonl between steps
W and S), `raw-tensor` (bench/raw_ddp.py indexing whole tensors, on the GPU when there is one:
expctl's in-memory data path, so the ratio measures the framework) and `raw-loader` (the same
script through a DataLoader, as most scripts are written: it measures the data path). The first
--warmup steps are not timed. Runs are interleaved (expctl, raw, expctl, raw...) so drift hits
all alike; cells are medians with min..max. Results go to --out as JSON after every row.

GPU workloads span the range: launch-bound (ResNet-18 with its ImageNet stem on 32x32 images:
1x1 final feature maps), CIFAR-style (the 3x3 stem, no max-pool: bench_models.resnet18_cifar),
compute-bound (ResNet-50 at 224x224, batch 256) and the Fashion-MNIST CNN. Model FLOPs per
sample (forward + backward, counted by torch.utils.flop_counter) against the bf16 matmul rate
measured on GPU 0 in the same invocation (bench/peak.py) give the MFU column.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA_ROOT = os.environ.get("EXPCTL_BENCH_DATA", "/usr/share/datasets/fashion-mnist")


@dataclass
class Workload:
    name: str
    model: str
    batch: int  # per worker
    steps: int
    warmup: int
    data: str = "synthetic"
    shape: str = "1x28x28"
    precision: str = "32"
    samples: int = 16384


def workloads(suite: str, smoke: bool) -> list[Workload]:
    if suite == "cpu":
        s = 4 if smoke else 1  # smoke: 4x fewer steps
        return [
            Workload("mlp", "mlp", 128, 400 // s, 100 // s),
            Workload("cnn", "cnn", 64, 120 // s, 40 // s),
        ]
    gpu = [
        Workload("compute: resnet50 224", "resnet50", 256, 80, 25, shape="3x224x224",
                 precision="bf16", samples=1024),
        Workload("cifar: resnet18 3x3 stem 32", "resnet18_cifar", 512, 100, 30,
                 shape="3x32x32", precision="bf16", samples=32768),
        Workload("launch: resnet18 32", "resnet18", 512, 200, 50, shape="3x32x32",
                 precision="bf16", samples=65536),
        Workload("fashion cnn", "cnn", 512, 200, 50, data="fashion", precision="bf16"),
    ]  # fmt: skip
    if smoke:  # CPU-sized stand-ins that still go through every code path
        for w in gpu:
            w.shape, w.samples, w.batch, w.steps, w.warmup = "3x32x32", 256, 8, 6, 2
            w.precision = "32"
            if w.data == "fashion":
                w.batch = 64
    if suite == "compile":
        return [w for w in gpu if w.name.startswith(("compute", "launch"))]
    return gpu


@dataclass
class Timed:
    """One contender run: samples/s over the timed steps, and where its wall time went."""

    rate: float
    wall: float
    start: float  # launch -> training loop ready (imports, CUDA, process group, data, model)
    end: float  # last timed step -> process exit (final validation, checkpoint, teardown)


def _run(cmd: list[str], env: dict[str, str], timeout: float = 900) -> tuple[str, float, float]:
    """stdout, wall seconds, and the launch time (time.time(), to compare with logged times)."""
    t, launched = time.perf_counter(), time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:8])}... exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    return proc.stdout, time.perf_counter() - t, launched


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


def trained_rate(rows: list[dict[str, Any]], after_step: int) -> float:
    """samples/s of the train rows after `after_step`: their steps over their training time.
    Each row's perf/samples_per_s leaves out the validations and checkpoints in its window (the
    run's last row is logged after its final checkpoint: time stamps would count it)."""
    later = [r for r in rows if "train/loss" in r and r["step"] > after_step]
    steps, seconds, prev = 0, 0.0, after_step
    for r in later:
        steps += r["step"] - prev
        seconds += (r["step"] - prev) / r["perf/samples_per_s"]
        prev = r["step"]
    return steps / seconds


def run_expctl(w: Workload, nproc: int, root: Path, env: dict[str, str], extra: list[str]) -> Timed:
    """samples/s of the train rows after step `warmup` (`trained_rate`); start: launch to the
    run's first train.log line (written once data and model are ready); end: the last step's
    event to exit (the final checkpoint, and the validation where the data has a split)."""
    run_dir = root / f"expctl-{time.time_ns()}"
    data = (
        ["data=fashion_mnist", f"data.root={DATA_ROOT}"]
        if w.data == "fashion"
        else [
            "data=synthetic",
            f"data.shape=[{w.shape.replace('x', ',')}]",
            f"data.num_samples={w.samples}",
            "data.val_samples=0",  # no validation: the raw loop has none
        ]
    )
    overrides = [
        f"model={w.model}",
        *(["imports=[bench_models]"] if w.model == "resnet18_cifar" else []),
        *data,
        "optim=sgd",
        "optim.lr=0.05",
        "optim.momentum=0.9",
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
    if nproc > 1:
        overrides += ["launcher=local", f"launcher.nproc={nproc}"]
    _, wall, launched = _run([sys.executable, "-m", "expctl", "run", *overrides], env)
    exited = time.time()
    events = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if "train/loss" in e]
    last = train[-1]
    head = (run_dir / "train.log").read_text()[:23]  # "2026-11-27 01:27:35,874 INFO run ..."
    ready = datetime.strptime(head, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logged
    shutil.rmtree(run_dir, ignore_errors=True)
    rate = trained_rate(train, w.warmup)
    return Timed(rate, wall, ready - launched, exited - last["time"])


def run_raw(w: Workload, nproc: int, env: dict[str, str], variant: list[str]) -> Timed:
    args = [
        *("--model", w.model, "--data", w.data, "--root", DATA_ROOT, "--shape", w.shape),
        *("--samples", str(w.samples), "--batch", str(w.batch), "--steps", str(w.steps)),
        *("--warmup", str(w.warmup), "--precision", w.precision),
    ]
    script = [str(HERE / "raw_ddp.py"), *args, *variant]
    if nproc > 1:
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd = [sys.executable, *launch, *script]
    else:
        cmd = [sys.executable, *script]
    out, wall, launched = _run(cmd, env)
    exited, got = time.time(), _json_line(out)
    start, end = got["t_ready"] - launched, exited - got["t_done"]
    return Timed(float(got["samples_per_s"]), wall, start, end)


def flops_per_sample(w: Workload) -> float:
    """Forward + backward FLOPs of one training sample (matmuls and convolutions)."""
    import torch
    from raw_ddp import make_model
    from torch.utils.flop_counter import FlopCounterMode

    shape = (1, 28, 28) if w.data == "fashion" else tuple(int(s) for s in w.shape.split("x"))
    model = make_model(w.model, shape, 10)
    x = torch.randn(2, *shape)
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops() / 2


def gpu_peak(env: dict[str, str]) -> dict[str, Any]:
    return _json_line(_run([sys.executable, str(HERE / "peak.py")], env)[0])


def static_ceiling(env: dict[str, str]) -> float:
    """ResNet-18 3x32x32 bf16 steps on one static batch, no data path, no framework."""
    gpu0 = {**env, "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    out, _, _ = _run([sys.executable, str(HERE / "scaling_probe.py"), "alone"], gpu0)
    return float(_json_line(out)["per_gpu"])


def contenders(suite: str, w: Workload, nproc: int, cuda: bool) -> dict[str, list[str] | None]:
    """label -> raw_ddp flags (None: expctl)."""
    cl = ["--channels-last"] if cuda else []
    if suite == "compile":  # CUDA graphs (reduce-overhead) where launches bound the step
        modes = ["default", "reduce-overhead"] if w.name.startswith("launch") else ["default"]
        out_c: dict[str, list[str] | None] = {
            "expctl": None,
            "raw-tensor": ["--loader", "tensor", *cl],
        }
        for mode in modes:
            tag = "" if mode == "default" else f" {mode}"
            out_c[f"expctl compile{tag}"] = []
            out_c[f"raw-tensor compile{tag}"] = ["--loader", "tensor", *cl, "--compile", mode]
        return out_c
    out: dict[str, list[str] | None] = {"expctl": None, "raw-tensor": ["--loader", "tensor", *cl]}
    if suite == "cpu" or nproc == 1:
        out["raw-loader"] = ["--loader", "dataloader", *cl, "--workers", "4" if cuda else "0"]
    return out


def expctl_extra(label: str) -> list[str]:
    if "compile" not in label:
        return []
    mode = label.rpartition("compile")[2].strip() or "default"
    return ["train.compile=true", f"train.compile_mode={mode}"]


def measure(
    suite: str, w: Workload, nproc: int, repeats: int, root: Path, env: dict[str, str],
    extra: list[str], cuda: bool,
) -> dict[str, Any]:  # fmt: skip
    runs: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    phases: dict[str, list[list[float]]] = {}
    errors: dict[str, str] = {}
    if cuda:  # each run sees only the GPUs it trains on (both contenders alike)
        visible = env.get("CUDA_VISIBLE_DEVICES") or ",".join(str(i) for i in range(8))
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(visible.split(",")[:nproc])}
    for i in range(repeats):  # interleaved, so drift hits every contender alike
        for label, variant in contenders(suite, w, nproc, cuda).items():
            if label in errors or (label == "raw-loader" and i > 0):  # the loader: one run
                continue
            try:
                if variant is None or label.startswith("expctl"):
                    got = run_expctl(w, nproc, root, env, [*extra, *expctl_extra(label)])
                else:
                    got = run_raw(w, nproc, env, variant)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                errors[label] = str(e)[-600:]
                print(f"  {label} failed: {str(e)[-300:]}", file=sys.stderr, flush=True)
                continue
            runs.setdefault(label, []).append(got.rate)
            walls.setdefault(label, []).append(got.wall)
            phases.setdefault(label, []).append([got.start, got.end])
    row: dict[str, Any] = {"workload": w.name, "gpus": nproc, "batch": w.batch, "runs": runs}
    row["walls"], row["phases"], row["errors"] = walls, phases, errors
    row["steps"], row["warmup"] = w.steps, w.warmup
    row["median"] = {k: statistics.median(v) for k, v in runs.items()}
    return row


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--suite", choices=("cpu", "gpu", "compile"), default="cpu")
    p.add_argument("--repeats", type=int, default=None, help="runs per contender (cpu: 3, else 1)")
    p.add_argument("--gpus", default=None, help="GPU (cpu: worker) counts (1,2,4; cpu: 1,2)")
    p.add_argument("--smoke", action="store_true", help="short runs (used by the tests)")
    p.add_argument("--only", default="", help="workloads whose name contains one of A,B,..")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--no-reference", action="store_true", help="skip the peak and the ceiling")
    p.add_argument("--expctl-args", default="", help="extra expctl overrides, space separated")
    p.add_argument(
        "--deadline", type=float, default=None,
        help="seconds: start no row after this (the rows left are listed as not run)",
    )  # fmt: skip
    args = p.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    sys.path.insert(0, str(HERE))
    cuda = args.suite != "cpu" and not args.smoke
    args.gpus = args.gpus or ("1,2" if args.suite == "cpu" else "1,2,4")
    try:
        counts = [int(n) for n in args.gpus.split(",")]
    except ValueError:
        p.error(f"--gpus {args.gpus}: a comma-separated list of counts, e.g. 1,2,4")
    if min(counts) < 1:
        p.error(f"--gpus {args.gpus}: counts are 1 or more")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats {args.repeats}: 1 or more")
    if args.deadline is not None and not args.deadline >= 0:  # (nan too)
        p.error(f"--deadline {args.deadline:g}: seconds, 0 or more")
    if args.suite == "compile":
        counts = [1]
    if args.suite == "cpu" and max(counts) > 2:
        p.error(f"--suite cpu runs 1 or 2 workers, not {max(counts)}")
    names = [w.name for w in workloads(args.suite, args.smoke)]
    if args.only and not any(o in n for o in args.only.split(",") for n in names):
        p.error(f"--only {args.only} matches no workload of --suite {args.suite}: {names}")
    if cuda:
        import torch

        if torch.cuda.device_count() < max(counts):
            p.error(
                f"--suite {args.suite} needs {max(counts)} CUDA GPU(s), this machine has "
                f"{torch.cuda.device_count()} (--smoke runs CPU-sized stand-ins)"
            )
    began = time.perf_counter()
    results: dict[str, Any] = {"suite": args.suite, "rows": [], "machine": os.uname().nodename}
    results["not_run"] = []
    if cuda and not args.no_reference:
        results["peak"] = gpu_peak(env)
        print(f"bf16 matmul peak: {results['peak']}", flush=True)
        if args.suite == "gpu" and (not args.only or "launch" in args.only):
            results["static_ceiling"] = static_ceiling(env)
            print(
                f"static-batch ceiling (ResNet-18 32x32, 1 GPU): {results['static_ceiling']:,.0f}"
            )
    with tempfile.TemporaryDirectory(prefix="expctl-bench-") as tmp:
        for w in workloads(args.suite, args.smoke):
            if args.only and not any(o in w.name for o in args.only.split(",")):
                continue
            repeats = args.repeats or (3 if args.suite == "cpu" else 1)
            flops = flops_per_sample(w)
            for n in counts:
                if args.deadline is not None and time.perf_counter() - began > args.deadline:
                    results["not_run"].append(f"{w.name} x{n}")
                    continue
                row = measure(
                    args.suite, w, n, 1 if args.smoke else repeats, Path(tmp), env,
                    args.expctl_args.split(), cuda,
                )  # fmt: skip
                row["flops_per_sample"] = flops
                results["rows"].append(row)
                print(format_row(row), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    if args.smoke and args.suite != "cpu":
        print("\n(smoke: CPU-sized stand-ins on the CPU; the columns say GPUs for workers)")
    results["seconds"] = time.perf_counter() - began
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(format_tables(results))
    if results["not_run"]:
        print(
            f"\nNot run (--deadline {args.deadline:g} s reached): {', '.join(results['not_run'])}"
        )
    print(f"\n(one invocation: {results['seconds']:.0f} s)")


def format_phases(rows: list[dict[str, Any]]) -> list[str]:
    """Where each run's wall time went (medians, seconds): start = launch to the training loop,
    end = the last step to exit; the rest is the steps (warm-up included)."""
    out = [
        "| workload | GPUs | expctl wall s | start | end | raw-tensor wall s | start | end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["workload"], str(r["gpus"])]
        for k in ("expctl", "raw-tensor"):
            if k not in r.get("phases", {}):
                cells += ["-", "-", "-"]
                continue
            ph = r["phases"][k]
            cells.append(f"{statistics.median(r['walls'][k]):.1f}")
            cells += [f"{statistics.median(p[j] for p in ph):.1f}" for j in (0, 1)]
        out.append("| " + " | ".join(cells) + " |")
    return out


def format_row(row: dict[str, Any]) -> str:
    cells = [f"{k}={v:,.0f}/s" for k, v in row["median"].items()]
    return f"{row['workload']:<30} x{row['gpus']}  " + "  ".join(cells)


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}..{max(values):,.0f})"


def format_tables(results: dict[str, Any]) -> str:
    """Markdown tables; ratios are of medians."""
    rows = results["rows"]
    suite = results["suite"]
    out: list[str] = []
    if suite == "cpu":
        out += [
            "| workload | workers | expctl samples/s | raw-tensor | raw-loader | expctl / raw-tensor "
            "| expctl / raw-loader |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            m, runs = r["median"], r["runs"]
            names = ("expctl", "raw-tensor", "raw-loader")
            cells = [_spread(runs[k]) if k in runs else "-" for k in names]
            ratios = [
                f"{m['expctl'] / m[k]:.3f}" if k in m and "expctl" in m else "-" for k in names[1:]
            ]
            out.append(f"| {r['workload']} | {r['gpus']} | " + " | ".join(cells + ratios) + " |")
        return "\n".join(out)
    peak = results.get("peak", {}).get("bf16_matmul_tflops")
    if suite == "compile":
        out += [
            "| workload | contender | img/s | / eager of the same | wall s | warm-up s vs eager |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            m, walls = r["median"], r["walls"]
            for k, v in m.items():
                base = "expctl" if k.startswith("expctl") else "raw-tensor"
                timed = (r["steps"] - r["warmup"]) * r["batch"]
                # wall minus the timed steps' share, against the eager run's: compile's warm-up
                warm = (
                    statistics.median(walls[k]) - timed / v
                    - (statistics.median(walls[base]) - timed / m[base])
                    if base in m else float("nan")
                )  # fmt: skip
                ratio = f"{v / m[base]:.3f}" if base in m else "-"
                out.append(
                    f"| {r['workload']} | {k} | {_spread(r['runs'][k])} | {ratio} | "
                    f"{statistics.median(walls[k]):.1f} | {warm:+.1f} |"
                )
            for k, e in r["errors"].items():
                out.append(f"| {r['workload']} | {k} | failed: {e.splitlines()[-1][:80]} | | | |")
        return "\n".join(out)
    if peak:
        out += [f"bf16 matmul peak measured on GPU 0: {peak:.0f} TFLOP/s", ""]
    out += [
        "| workload | GPUs | expctl img/s | raw-tensor img/s | expctl / raw | expctl scaling "
        "| raw scaling | raw-loader img/s | model TFLOP/s per GPU (expctl) | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = {(r["workload"], k): v for r in rows if r["gpus"] == 1 for k, v in r["median"].items()}
    for r in rows:
        m, n = r["median"], r["gpus"]
        e, raw = m.get("expctl"), m.get("raw-tensor")

        def scaling(k: str, v: float | None, r: dict[str, Any] = r, n: int = n) -> str:
            base = one.get((r["workload"], k))
            return f"{v / (n * base):.3f}" if v and base else "-"

        tflops = e * r["flops_per_sample"] / n / 1e12 if e else None
        cells = [
            r["workload"],
            str(n),
            _spread(r["runs"]["expctl"]) if e else "failed",
            _spread(r["runs"]["raw-tensor"]) if raw else "failed",
            f"{e / raw:.3f}" if e and raw else "-",
            scaling("expctl", e),
            scaling("raw-tensor", raw),
            f"{m['raw-loader']:,.0f}" if "raw-loader" in m else "",
            f"{tflops:.1f}" if tflops else "-",
            f"{tflops / peak:.1%}" if tflops and peak else "-",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", *format_phases(rows)]
    if "static_ceiling" in results:
        c = results["static_ceiling"]
        e1 = one.get(("launch: resnet18 32", "expctl"))
        out.append(
            f"\nStatic-batch ceiling (bench/scaling_probe.py alone, 1 GPU): {c:,.0f} img/s"
            + (f"; expctl launch-bound 1 GPU / ceiling = {e1 / c:.3f}" if e1 else "")
        )
    return "\n".join(out)


if __name__ == "__main__":
    main()
