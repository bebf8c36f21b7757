"""train.strategy=fsdp against a raw FSDP2 loop (bench/raw_fsdp.py) on the same GPT and tokens.

    python bench/fsdp_bench.py --parts speed,compile,big,resume --gpus 1,2,4 --out DIR
    python bench/fsdp_bench.py --smoke --out DIR        # CPU, gloo, a tiny GPT: every code path

Parts (one table each, to stdout and DIR/fsdp.md; raw figures to DIR/fsdp.json after each row):
- speed:   a ~1B GPT (18 x 2048, 16 heads, block 2048), bf16, batch 4 per GPU, eager, at each GPU
           count: expctl tokens/s (its own metrics between steps --warmup and --steps) against
           the raw loop's; MFU against the bf16 matmul rate measured now (bench/peak.py); peak
           memory per GPU; the time expctl's final sharded checkpoint took to write.
- compile: the same with train.compile=true / torch.compile per block, at 1 and the most GPUs.
- big:     a ~10B GPT (48 x 4096, 32 heads), batch 2 per GPU, full activation checkpointing,
           on the most GPUs: ddp (every rank holds the fp32 weights, gradients and AdamW state,
           16 bytes a parameter: ~160 GB, more than an H100's or an H200's memory: expected out
           of memory) and fsdp (tokens/s, peak memory per GPU).
- resume:  the speed part's checkpoint of the most GPUs (step --steps) continued for 100 steps
           on half the GPUs (twice the batch per GPU: the same global batches) and on as many GPUs
           as wrote it; the per-step losses compared, and the time the resharded read took.
The token files are made here: ids of 4,096 random 32-token phrases strung together (a model can
learn them, so losses fall), uint16, 16 M training tokens.
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
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def make_tokens(root: Path, train_tokens: int, vocab: int, block: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    phrases = rng.integers(0, vocab, size=(4096, 32), dtype=np.uint16)
    for split, n in (("train", train_tokens), ("val", 16 * (block + 1))):
        picks = rng.integers(0, len(phrases), size=n // 32 + 1)
        phrases[picks].reshape(-1)[:n].tofile(root / f"{split}.bin")


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError(f"no JSON result in output:\n{text[-2000:]}")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.smoke = args, args.smoke
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.data = self.work / "tokens"
        # the big model's final checkpoint (~120 GB) goes to memory where there is room
        shm = Path("/dev/shm")
        room = shm.is_dir() and shutil.disk_usage(shm).free > 150e9
        self.shm = shm / "fsdp-bench" if room else self.work
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]),
        }
        self.results: dict[str, Any] = {"rows": [], "started": time.strftime("%F %T")}
        self.lines: list[str] = []
        if self.smoke:
            self.vocab, self.block = 512, 64
            self.sizes = {"1B": (2, 32, 4), "10B": (2, 64, 4)}  # layers, d_model, heads
            self.batch, self.steps, self.warmup, self.more = 4, 6, 2, 4
        else:
            self.vocab, self.block = 50304, 2048
            self.sizes = {"1B": (18, 2048, 16), "10B": (48, 4096, 32)}
            self.batch, self.steps, self.warmup, self.more = 4, 30, 10, 100

    # --- the contenders ---------------------------------------------------------------------

    def expctl(
        self, size: str, n: int, batch: int, extra: list[str], name: str, timeout: float = 600
    ) -> dict[str, Any]:
        layers, dim, heads = self.sizes[size]
        run_dir = (self.shm if size == "10B" else self.work) / name
        shutil.rmtree(run_dir, ignore_errors=True)
        overrides = [
            "model=gpt", f"model.n_layer={layers}", f"model.d_model={dim}", f"model.n_head={heads}",
            "data=tokens", f"data.root={self.data}", f"data.block_size={self.block}",
            f"data.vocab_size={self.vocab}", f"data.batch_size={batch}",
            "optim=adamw", "optim.lr=3e-4", "optim.weight_decay=0.1", "sched=none",
            "loss=cross_entropy", "train.step=lm", "train.strategy=fsdp",
            f"train.precision={'32' if self.smoke else 'bf16'}",
            f"train.max_steps={self.steps}", f"train.log_every={self.warmup}", f"run.dir={run_dir}",
            *(["launcher=local", f"launcher.nproc={n}"] if n > 1 else []),
            *extra,
        ]  # fmt: skip
        t = time.perf_counter()
        proc = _run([sys.executable, "-m", "expctl", "run", *overrides], self.env, timeout)
        got: dict[str, Any] = {"wall_s": round(time.perf_counter() - t, 1), "rc": proc.returncode}
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            errors = [x for x in log.splitlines() if "rror" in x or x.startswith("expctl:")]
            got["error"] = (errors[-1] if errors else log.strip().splitlines()[-1])[:300]
            return got
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in rows if "train/loss" in r]
        base = self.steps if any("checkpoint.resume=" in x for x in extra) else 0
        first = next(r for r in train if r["step"] >= base + self.warmup)
        last = train[-1]
        tokens = (last["step"] - first["step"]) * batch * n * self.block
        got["tokens_per_s"] = round(tokens / (last["time"] - first["time"]), 1)
        got["max_mem_gib"] = max((r.get("perf/max_mem_gib", 0.0) for r in train[1:]), default=0.0)
        got["losses"] = {r["step"]: r["train/loss"] for r in train}
        for key, pattern in (
            ("write_s", r"written in ([\d.]+) s"),
            ("read_s", r"read in ([\d.]+) s"),
        ):
            found = re.findall(pattern, log)
            if found:
                got[key] = float(found[-1])
        got["run_dir"] = str(run_dir)
        return got

    def raw(self, size: str, n: int, batch: int, extra: list[str]) -> dict[str, Any]:
        layers, dim, heads = self.sizes[size]
        script = [
            str(HERE / "raw_fsdp.py"), "--root", str(self.data), "--vocab", str(self.vocab),
            "--block", str(self.block), "--layers", str(layers), "--dim", str(dim),
            "--heads", str(heads), "--batch", str(batch), "--steps", str(self.steps),
            "--warmup", str(self.warmup), *extra,
        ]  # fmt: skip
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
        t = time.perf_counter()
        proc = _run([sys.executable, *(launch if n > 1 else []), *script], self.env, 600)
        if proc.returncode != 0:
            return {"rc": proc.returncode, "error": (proc.stderr or proc.stdout)[-300:]}
        return {**_json_line(proc.stdout), "wall_s": round(time.perf_counter() - t, 1)}

    # --- the parts ----------------------------------------------------------------------------

    def flops_per_token(self, size: str) -> float:
        import torch

        from expctl.builtin.gpt import GPT

        layers, dim, heads = self.sizes[size]
        with torch.device("meta"):
            return float(GPT(self.vocab, self.block, layers, heads, dim).flops_per_token())

    def mfu(self, tokens_per_s: float | None, size: str, n: int) -> str:
        peak = self.results.get("peak_tflops")
        if not tokens_per_s or not peak:
            return "-"
        return f"{tokens_per_s * self.flops_per_token(size) / (n * peak * 1e12):.1%}"

    def record(self, row: dict[str, Any]) -> None:
        self.results["rows"].append(row)
        (self.out / "fsdp.json").write_text(json.dumps(self.results, indent=1))

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        (self.out / "fsdp.md").write_text("\n".join(self.lines) + "\n")

    def throughput(self, counts: list[int], compiled: bool) -> None:
        label = "torch.compile per block" if compiled else "eager"
        self.say(
            f"\n### ~1B GPT, bf16, batch {self.batch} x {self.block} tokens per GPU, {label}\n"
        )
        self.say("| GPUs | raw FSDP2 tokens/s | expctl tokens/s | expctl/raw | MFU raw / expctl "
                 "| peak GiB/GPU raw / expctl | checkpoint write s |")  # fmt: skip
        self.say("|---|---|---|---|---|---|---|")
        for n in counts:
            raw = self.raw("1B", n, self.batch, ["--compile"] if compiled else [])
            name = f"speed-{'c' if compiled else 'e'}{n}"
            ours = self.expctl(
                "1B", n, self.batch, ["train.compile=true"] if compiled else [], name
            )
            self.record({"part": label, "gpus": n, "raw": raw, "expctl": ours})
            r, e = raw.get("tokens_per_s"), ours.get("tokens_per_s")
            ratio = f"{e / r:.3f}" if r and e else f"- ({raw.get('error') or ours.get('error')})"
            self.say(
                f"| {n} | {r or '-'} | {e or '-'} | {ratio} | {self.mfu(r, '1B', n)} / "
                f"{self.mfu(e, '1B', n)} | {raw.get('max_mem_gib', '-')} / "
                f"{ours.get('max_mem_gib', '-')} | {ours.get('write_s', '-')} |"
            )
            keep = not compiled and n == max(counts)
            if not keep and "run_dir" in ours:
                shutil.rmtree(ours["run_dir"], ignore_errors=True)
            if keep:
                self.results["resume_from"] = ours.get("run_dir")

    def big(self, n: int, strategies: list[str]) -> None:
        self.say(f"\n### ~10B GPT, bf16, batch 2 x {self.block} tokens per GPU, {n} GPUs, full "
                 "activation checkpointing\n")  # fmt: skip
        self.say("| strategy | result | tokens/s | MFU | peak GiB/GPU | wall s |")
        self.say("|---|---|---|---|---|---|")
        for strategy in strategies:
            extra = [f"train.strategy={strategy}", "train.activation_checkpointing=full"]
            got = self.expctl("10B", n, 2, extra, f"big-{strategy}", timeout=420)
            got.pop("losses", None)
            self.record({"part": "big", "gpus": n, "strategy": strategy, "expctl": got})
            result = "trained" if got["rc"] == 0 else f"exit {got['rc']}: {got.get('error', '')}"
            self.say(
                f"| {strategy} | {result} | {got.get('tokens_per_s', '-')} | "
                f"{self.mfu(got.get('tokens_per_s'), '10B', n)} | {got.get('max_mem_gib', '-')} | "
                f"{got['wall_s']} |"
            )
            shutil.rmtree(self.shm / f"big-{strategy}", ignore_errors=True)

    def resume(self, n: int) -> None:
        source = self.results.get("resume_from")
        if not source or n < 2:
            self.say("\nresume: no checkpoint of the speed part on 2 or more GPUs to resume")
            return
        ckpts = sorted((Path(source) / "checkpoints").glob("*.dcp"))
        ckpt, end = ckpts[-1], self.steps + self.more
        self.say(f"\n### {ckpt.name} of {n} GPUs (~1B, bf16) continued {self.more} steps\n")
        runs = {}
        for m in (n, n // 2):
            batch = self.batch * n // m  # the same global batch
            extra = [f"checkpoint.resume={ckpt}", f"train.max_steps={end}", "train.log_every=1"]
            runs[m] = self.expctl("1B", m, batch, extra, f"resume-{m}")
            runs[m].pop("run_dir", None)
            shutil.rmtree(self.work / f"resume-{m}", ignore_errors=True)
        self.record({"part": "resume", "from": n, "runs": runs})
        a, b = runs[n].get("losses", {}), runs[n // 2].get("losses", {})
        steps = sorted(set(a) & set(b))
        diffs = [abs(a[s] - b[s]) for s in steps]
        self.say(
            "| continued on | GPUs | checkpoint read s | tokens/s | loss at first / last step |"
        )
        self.say("|---|---|---|---|---|")
        for m, got in runs.items():
            losses = got.get("losses", {})
            ends = f"{losses[min(losses)]:.4f} / {losses[max(losses)]:.4f}" if losses else "-"
            what = "the layout that wrote it" if m == n else "half the GPUs (resharded)"
            self.say(
                f"| {what} | {m} | {got.get('read_s', '-')} | {got.get('tokens_per_s', '-')} "
                f"| {ends} |" + (f" {got['error']}" if "error" in got else "")
            )
        if diffs:
            rel = [abs(a[s] - b[s]) / abs(a[s]) for s in steps]
            self.say(
                f"\n{len(steps)} steps compared: |loss difference| median {statistics.median(diffs):.2e}, "
                f"max {max(diffs):.2e} (relative max {max(rel):.2e}; bf16's resolution is 7.8e-3)"
            )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--parts", default="speed,compile,big,resume")
    p.add_argument("--gpus", default="1,2,4", help="GPU counts of the speed part")
    p.add_argument("--out", default="/tmp/out")
    p.add_argument("--work", default="/tmp/fsdp-bench", help="token files and run directories")
    p.add_argument("--compile-gpus", default=None, help="GPU counts of the compile part (1,MOST)")
    p.add_argument("--big-strategies", default="ddp,fsdp", help="the big part's strategies")
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, a tiny GPT (the tests)")
    args = p.parse_args()
    bench, counts = Bench(args), [int(x) for x in args.gpus.split(",")]
    parts = args.parts.split(",")
    make_tokens(bench.data, 1 << 16 if args.smoke else 1 << 24, bench.vocab, bench.block)
    if not args.smoke:
        got = _run([sys.executable, str(HERE / "peak.py")], bench.env, 120)
        bench.results["peak_tflops"] = round(_json_line(got.stdout)["bf16_matmul_tflops"], 1)
        bench.say(f"measured bf16 matmul peak: {bench.results['peak_tflops']} TFLOP/s per GPU")
    most = max(counts)
    if "speed" in parts or "resume" in parts:
        bench.throughput(counts, compiled=False)
    if "compile" in parts:
        chosen = args.compile_gpus or f"{min(counts)},{most}"
        bench.throughput(sorted({int(x) for x in chosen.split(",")}), compiled=True)
    if "big" in parts:
        bench.big(most, args.big_strategies.split(","))
    if "resume" in parts:
        bench.resume(most)


if __name__ == "__main__":
    main()
