"""Training throughput from a folder of JPEGs vs GPU-resident synthetic tensors (issue 11).

    python bench/images_bench.py make --root /tmp/jpegs            # 20,000 + 1,000 JPEGs, ~500x375
    python bench/images_bench.py run --root /tmp/jpegs --gpus 1 2   # prints one table

ResNet-50, 224x224, bf16, batch 256 per GPU, SGD; every contender trains the same model from
the same folder (or from synthetic tensors of the same shape) in this one invocation:

- ``synthetic``: expctl, ``data=synthetic`` held on the GPU: the ceiling without data loading;
- ``folder gpu`` / ``folder cpu``: expctl, ``data=image_folder`` with nvJPEG on the GPU or
  Pillow in the DataLoader workers (``auto`` picks the first on CUDA);
- ``torchvision``: bench/raw_images.py, a plain loop on torchvision's ImageFolder + PIL
  transforms + DataLoader (workers = cores), one GPU.

img/s counts the optimizer steps after --warmup (expctl: from the time stamps of its
metrics.jsonl train events; the raw loop: its own clock).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from harness import _json_line, _run, trained_rate

HERE = Path(__file__).resolve().parent
COMMON = [
    "model=resnet50", "optim=sgd", "optim.lr=0.1", "sched=none", "train.precision=bf16",
    "data.batch_size=256", "train.val_every=100000", "train.max_epochs=100000",
    "train.limit_val_batches=1", "checkpoint.every=1000000",
]  # fmt: skip


def _size(rng: random.Random, shapes: str) -> tuple[int, int]:
    """A photograph's width and height. "four": one of four sizes (~500x375). "imagenet": as
    many sizes as ImageNet's (a model of its train set, not measured on it: 40% 500x375, 10%
    375x500, 8% 500x333, 22% 500 on the long side and 200-499 on the other, 20% anything from
    100 to 1200 pixels wide with an aspect of 0.6-1.7): ~100 sizes in a batch of 256."""
    if shapes == "four":
        return rng.choice([(500, 375), (375, 500), (500, 333), (480, 360)])
    r = rng.random()
    if r < 0.40:
        return 500, 375
    if r < 0.50:
        return 375, 500
    if r < 0.58:
        return 500, 333
    if r < 0.80:
        other = rng.randint(200, 499)
        return (500, other) if rng.random() < 0.7 else (other, 500)
    w = rng.randint(100, 1200)
    return w, max(32, round(w / rng.uniform(0.6, 1.7)))


def _write(job: tuple[Path, int, str]) -> int:
    """One ImageNet-like JPEG: smooth shapes plus noise, of `_size`, quality 90 (~100 KB at
    500x375)."""
    from PIL import Image, ImageDraw, ImageFilter

    path, seed, shapes = job
    rng = random.Random(seed)
    w, h = _size(rng, shapes)
    img = Image.effect_noise((w, h), rng.uniform(100, 128)).convert("RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        box = sorted(rng.sample(range(w), 2)), sorted(rng.sample(range(h), 2))
        fill = tuple(rng.randrange(256) for _ in range(3))
        draw.ellipse([box[0][0], box[1][0], box[0][1], box[1][1]], fill=fill)  # type: ignore[arg-type]
    img = img.filter(ImageFilter.GaussianBlur(0.3))
    img.save(path, "JPEG", quality=90)
    return path.stat().st_size


def make(root: Path, train: int, val: int, classes: int, shapes: str = "four") -> None:
    jobs = []
    for split, n in (("train", train), ("val", val)):
        for i in range(n):
            folder = root / split / f"c{i % classes:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            jobs.append((folder / f"{i:06d}.jpg", hash((split, i)) & 0xFFFFFFF, shapes))
    start = time.time()
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        sizes = list(pool.map(_write, jobs, chunksize=64))
    print(
        f"wrote {len(sizes)} JPEGs in {time.time() - start:.0f} s, "
        f"mean {sum(sizes) / len(sizes) / 1024:.0f} KiB",
        flush=True,
    )


def expctl_img_s(
    overrides: list[str],
    gpus: int,
    steps: int,
    warmup: int,
    env: dict[str, str],
    common: list[str] = COMMON,
) -> tuple[float, str]:
    """img/s of one expctl run (`common` + `overrides`; `data.batch_size` per GPU) after
    `warmup` steps, and the data part of its first log line (which data path, and why)."""
    run_dir = Path(tempfile.mkdtemp(prefix="imgbench-"))
    args = [
        *common,
        *overrides,
        f"train.max_steps={steps}",
        f"train.log_every={warmup}",
        f"run.dir={run_dir}/run",
    ]
    if gpus > 1:
        args += ["launcher=local", f"launcher.nproc={gpus}"]
    _run([sys.executable, "-m", "expctl", "run", *args], env, timeout=1200)
    events = [json.loads(x) for x in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [e for e in events if "train/loss" in e]
    line = (run_dir / "run" / "train.log").read_text().splitlines()[0]
    shutil.rmtree(run_dir, ignore_errors=True)
    return trained_rate(train, warmup), next(
        (part for part in line.split(" | ") if part.startswith("data ")), ""
    )


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--root", type=Path, required=True)
    m.add_argument("--train", type=int, default=20000)
    m.add_argument("--val", type=int, default=1000)
    m.add_argument("--classes", type=int, default=100)
    r = sub.add_parser("run")
    r.add_argument("--root", type=Path, required=True)
    r.add_argument("--gpus", type=int, nargs="+", default=[1])
    r.add_argument("--steps", type=int, default=100)
    r.add_argument("--warmup", type=int, default=25)
    r.add_argument("--only", nargs="*", default=None, help="contenders to run")
    a = p.parse_args()
    if a.cmd == "make":
        make(a.root, a.train, a.val, a.classes)
        return
    env = dict(os.environ)
    folder = ["data=image_folder", f"data.root={a.root}"]
    synthetic = [
        "data=synthetic",
        "data.shape=[3,224,224]",
        "data.num_samples=3072",
        "data.val_samples=256",
    ]
    rows = []
    for gpus in a.gpus:
        contenders = {
            "synthetic (GPU-resident)": lambda g=gpus: expctl_img_s(
                synthetic, g, a.steps, a.warmup, env
            ),
            "folder gpu (nvJPEG)": lambda g=gpus: expctl_img_s(
                [*folder, "data.decode=gpu"], g, a.steps, a.warmup, env
            ),
            "folder cpu (Pillow)": lambda g=gpus: expctl_img_s(
                [*folder, "data.decode=cpu"], g, a.steps, a.warmup, env
            ),
        }
        if gpus == 1:
            contenders["torchvision ImageFolder"] = lambda: (
                float(
                    _json_line(
                        _run(
                            [
                                sys.executable,
                                str(HERE / "raw_images.py"),
                                "--root",
                                str(a.root / "train"),
                                "--steps",
                                str(a.steps),
                                "--warmup",
                                str(a.warmup),
                            ],
                            env,
                            1200,
                        ).stdout
                    )["samples_per_s"]
                ),
                f"DataLoader, {len(os.sched_getaffinity(0))} workers",
            )
        for name, fn in contenders.items():
            if a.only and not any(o in name for o in a.only):
                continue
            try:
                rate, how = fn()
            except Exception as e:  # one contender's failure is a row, not the end of the table
                rate, how = float("nan"), f"FAILED: {str(e).strip().splitlines()[-1][:100]}"
            rows.append((gpus, name, rate, how))
            print(f"{gpus} GPU  {name:26s} {rate:8.0f} img/s  {how}", flush=True)
    print("\n| GPUs | contender | img/s | / synthetic | how |\n|---|---|---|---|---|")
    for gpus, name, rate, how in rows:
        base = next(
            (r for g, n, r, _ in rows if g == gpus and n.startswith("synthetic")), float("nan")
        )
        print(f"| {gpus} | {name} | {rate:,.0f} | {rate / base:.3f} | {how} |")


if __name__ == "__main__":
    main()
