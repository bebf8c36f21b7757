"""Where a profiled window's GPU time goes: a Chrome trace of torch.profiler (e.g. from
`train.step=profiled` with PROFILE_TRACE=PATH, `bench/step_profile.py`) read per CUDA stream.

    python bench/trace_gaps.py TRACE.json[.gz] [--steps N] [--top 8]

Prints, for the window from the first to the last kernel of the busiest stream (the step's):
each stream's kernel time and its share of the window; the busiest stream's idle gaps (count,
sum, by size) and, for the largest, what else ran meanwhile: another stream's kernels (the
feeding stream's decode, say) and the CUDA calls a CPU thread was blocked in (a synchronize, an
event wait); how much of the step stream's kernel time had another stream's kernels beside it;
and the CUDA runtime calls by thread. A diagnosis of one window, not a measurement.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
from typing import Any

GPU = ("kernel", "gpu_memcpy", "gpu_memset")
BLOCKING = (
    "Synchronize",
    "cudaMemcpy",
    "cudaStreamWaitEvent",
    "cudaEventQuery",
    "cudaMalloc",
    "cudaFree",
)


def load(path: str) -> list[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(spans: list[tuple[float, float]], a: float, b: float) -> float:
    """Time of [a, b] that the (merged, sorted) spans cover."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans if y > a and x < b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument(
        "--steps", type=int, default=0, help="steps in the window (for per-step figures)"
    )
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args()
    events = load(a.trace)
    gpu = [e for e in events if e.get("cat") in GPU]
    if not gpu:
        print(f"{a.trace}: no GPU events (a CPU run, or the profiler saw no CUDA)")
        return
    by_stream: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in gpu:
        by_stream[int(e.get("args", {}).get("stream", -1))].append(e)
    spans = {s: union([(e["ts"], e["ts"] + e["dur"]) for e in es]) for s, es in by_stream.items()}
    busy = {s: sum(b - x for x, b in sp) for s, sp in spans.items()}
    main_s = max(busy, key=lambda s: busy[s])
    t0, t1 = spans[main_s][0][0], spans[main_s][-1][1]
    wall = t1 - t0
    per = f", {wall / a.steps / 1e3:.2f} ms a step over {a.steps}" if a.steps else ""
    print(f"window {wall / 1e3:.1f} ms (first to last kernel of stream {main_s}){per}")
    print(f"{'stream':>8} {'events':>7} {'busy ms':>9} {'% window':>9}  top kernels (ms)")
    for s in sorted(busy, key=lambda s: -busy[s]):
        names: collections.Counter[str] = collections.Counter()
        for e in by_stream[s]:
            names[e["name"][:48]] += e["dur"]
        top = "; ".join(f"{n} {d / 1e3:.1f}" for n, d in names.most_common(3))
        inside = covered(spans[s], t0, t1)
        print(
            f"{s:>8} {len(by_stream[s]):>7} {busy[s] / 1e3:>9.1f} {100 * inside / wall:>8.1f}%  {top}"
        )

    others = union([x for s, sp in spans.items() if s != main_s for x in sp])
    beside = sum(covered(others, x, b) for x, b in spans[main_s])
    print(
        f"stream {main_s}'s kernel time with another stream's kernels beside it: "
        f"{beside / 1e3:.1f} of {busy[main_s] / 1e3:.1f} ms ({100 * beside / busy[main_s]:.1f}%)"
    )

    main_sp = spans[main_s]
    gaps = [(main_sp[i][1], main_sp[i + 1][0]) for i in range(len(main_sp) - 1)]
    gaps = [(x, b) for x, b in gaps if b - x >= 5.0]
    sizes = [(b - x) for x, b in gaps]
    buckets = [(5, 50), (50, 500), (500, 5000), (5000, 1e12)]
    label = {5: "5-50 us", 50: "50-500 us", 500: "0.5-5 ms", 5000: ">5 ms"}
    print(
        f"stream {main_s} idle inside the window: {sum(sizes) / 1e3:.1f} ms "
        f"({100 * sum(sizes) / wall:.1f}%) in {len(sizes)} gaps of >= 5 us: "
        + ", ".join(
            f"{label[lo]} {sum(1 for d in sizes if lo <= d < hi)} ({sum(d for d in sizes if lo <= d < hi) / 1e3:.1f} ms)"
            for lo, hi in buckets
        )
    )
    other_in_gaps = sum(covered(others, x, b) for x, b in gaps)
    print(f"  of which another stream was busy: {other_in_gaps / 1e3:.1f} ms")

    runtime = [e for e in events if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"]
    main_kernels = sorted(by_stream[main_s], key=lambda e: e["ts"])
    starts = [e["ts"] for e in main_kernels]

    print(f"the {a.top} largest gaps (ms from the window's start):")
    for x, b in sorted(gaps, key=lambda g: g[0] - g[1])[: a.top]:
        i = bisect.bisect_left(starts, b)
        before = main_kernels[max(0, i - 1)]["name"][:40]
        after = main_kernels[i]["name"][:40] if i < len(main_kernels) else "-"
        blocked = [
            e
            for e in runtime
            if any(k in e["name"] for k in BLOCKING) and e["ts"] < b and e["ts"] + e["dur"] > x
        ]
        calls = ", ".join(
            f"{e['name']}@{e.get('tid')} {e['dur'] / 1e3:.2f}ms"
            for e in sorted(blocked, key=lambda e: -e["dur"])[:3]
        )
        print(
            f"  {(x - t0) / 1e3:8.2f} +{(b - x) / 1e3:.2f}: other streams busy "
            f"{100 * covered(others, x, b) / (b - x):.0f}%; after [{before}] before [{after}]; "
            f"blocked CPU calls: {calls or 'none'}"
        )

    launches = {e["args"]["correlation"]: e for e in runtime if "correlation" in e.get("args", {})}
    late = [0, 0.0]  # gaps >= 50 us whose next kernel was launched < 30 us before it started
    big = [(x, b) for x, b in gaps if b - x >= 50.0]
    for x, b in big:
        i = bisect.bisect_left(starts, b)
        call = (
            launches.get(main_kernels[i].get("args", {}).get("correlation"))
            if i < len(starts)
            else None
        )
        if call is not None and main_kernels[i]["ts"] - (call["ts"] + call["dur"]) < 30.0:
            late[0] += 1
            late[1] += b - x
    print(
        f"  gaps >= 50 us: {len(big)} ({sum(b - x for x, b in big) / 1e3:.1f} ms); the next kernel "
        f"launched < 30 us before it started (the GPU waited for the CPU): {late[0]} "
        f"({late[1] / 1e3:.1f} ms)"
    )

    ops: dict[tuple[Any, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") in ("cpu_op", "user_annotation") and t0 <= e["ts"] <= t1:
            ops[(e.get("tid"), e["name"])].append(e["dur"])
    print("CPU ops inside the window, by thread (the 8 longest in total; nested ops count again):")
    for (tid, name), durs in sorted(ops.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(
            f"  {name[:48]:48} thread {tid!s:>10}: {len(durs):5} calls, {sum(durs) / 1e3:8.1f} ms, "
            f"mean {sum(durs) / len(durs) / 1e3:.3f}"
        )

    calls: dict[tuple[str, Any], list[float]] = collections.defaultdict(list)
    for e in runtime:
        if t0 <= e["ts"] <= t1:
            calls[(e["name"], e.get("tid"))].append(e["dur"])
    print("CUDA calls inside the window, by thread (the 12 longest in total):")
    for (name, tid), durs in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(
            f"  {name:34} thread {tid!s:>10}: {len(durs):6} calls, {sum(durs) / 1e3:8.1f} ms, max {max(durs) / 1e3:.2f}"
        )


if __name__ == "__main__":
    main()
