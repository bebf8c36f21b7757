"""Time to accuracy: `expctl run experiment=fashion_speedrun` N times per variant, and the same
recipe as a plain script (raw_speedrun.py); one table with the median, min and max.

    python bench/speedrun.py --root /usr/share/datasets/fashion-mnist --repeats 3
    python bench/speedrun.py --root DIR --variant "12 epochs=train.max_epochs=12"

`time/train_s` is expctl's training clock (the loop and the final evaluation, as the raw
script's); val/acc is scored on the 10,000 test images (the preset validates on the test split).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--root", required=True, help="the Fashion-MNIST folder (its .gz files)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variant", action="append", default=[], help="LABEL=override override ...")
    p.add_argument("--raw", type=int, default=1, help="runs of the plain script")
    p.add_argument("--no-preset", action="store_true", help="only the --variant recipes")
    args = p.parse_args()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]
        ),
    }
    variants: dict[str, list[str]] = {} if args.no_preset else {"preset": []}
    for v in args.variant:
        label, _, rest = v.partition("=")
        variants[label] = rest.split()
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for label, extra in variants.items():
                run_dir = Path(tmp) / f"v{list(variants).index(label)}-{i}"
                cmd = [sys.executable, "-m", "expctl", "run", "experiment=fashion_speedrun"]
                cmd += [f"data.root={args.root}", f"run.dir={run_dir}", *extra]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode:
                    print(f"{label}: failed\n{proc.stderr[-1500:]}", file=sys.stderr)
                    continue
                r = json.loads((run_dir / "result.json").read_text())
                rows.setdefault(label, []).append((r["val/acc"], r["time/train_s"]))
                print(label, rows[label][-1], flush=True)
        for _ in range(args.raw):
            cmd = [sys.executable, str(HERE / "raw_speedrun.py"), "--root", args.root]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode:  # e.g. no GPU: the plain script is CUDA-only
                print(f"raw script: failed\n{proc.stderr[-1500:]}", file=sys.stderr)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.setdefault("raw script (preset)", []).append((r["test_acc"], r["train_s"]))
    print("\n| recipe | runs | test acc median (min..max) | train s median (min..max) |")
    print("|---|---|---|---|")
    for label, got in rows.items():
        acc, secs = [a for a, _ in got], [s for _, s in got]
        print(
            f"| {label} | {len(got)} | {statistics.median(acc):.2%} ({min(acc):.2%}..{max(acc):.2%})"
            f" | {statistics.median(secs):.2f} ({min(secs):.2f}..{max(secs):.2f}) |"
        )


if __name__ == "__main__":
    main()
