"""Is the reported accuracy the saved model's? Train a BatchNorm model with N workers, then score
the model `expctl.load_model` returns on the same validation images, in this process.

    python bench/bn_parity.py --workers 1 2 --steps 240                  # Fashion-MNIST ResNet-18
    python bench/bn_parity.py --workers 2 --extra train.sync_batchnorm=true   # GPUs only

Prints one row per run: workers, result.json's val/acc, the loaded model's accuracy, and whether
the two agree to the sample (they must: every rank takes rank 0's buffers before it validates
and saves).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def score(run_dir: Path) -> tuple[int, int]:
    """Correct predictions of the saved model on the run's validation split, and its size, with
    the run's own numerics (precision, batch size, memory format): bf16 on a GPU can flip an
    argmax when any of them differs."""
    import expctl
    from expctl import registry
    from expctl.config import frozen as config
    from expctl.rank.build import resolve_precision

    cfg = config.load(run_dir)
    registry.import_user_modules(cfg.imports)
    splits = registry.get("datasets", cfg.data.name).factory(**cfg.data.args)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = expctl.load_model(run_dir, device=str(device))
    cl = cfg.train.channels_last is True or (
        cfg.train.channels_last == "auto" and device.type == "cuda"
    )
    if cl:
        model.to(memory_format=torch.channels_last)
    bf16 = resolve_precision(cfg.train.precision, device) == "bf16"
    batch = cfg.data.val_batch_size or cfg.data.batch_size
    x, y = splits.val.tensors[0], splits.val.tensors[1]
    correct = 0
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=bf16):
        for i in range(0, len(y), batch):
            xb = x[i : i + batch].to(device)
            out = model(xb.contiguous(memory_format=torch.channels_last) if cl else xb)
            correct += int((out.argmax(1).cpu() == y[i : i + batch]).sum())
    return correct, len(y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--preset", default="fashion_resnet18")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides, e.g. data.root=...")
    args = p.parse_args()
    print(f"{'workers':>7}  {'result.json val/acc':>19}  {'load_model acc':>14}  same  extra")
    for n in args.workers:
        run_dir = Path(tempfile.mkdtemp(prefix=f"bn{n}-")) / "run"
        launcher = ["launcher=local", f"launcher.nproc={n}"] if n > 1 else []
        cmd = [sys.executable, "-m", "expctl", "run", f"experiment={args.preset}"]
        cmd += [*launcher, f"train.max_steps={args.steps}", f"run.dir={run_dir}", *args.extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        reported = json.loads((run_dir / "result.json").read_text())["val/acc"]
        correct, total = score(run_dir)
        same = round(reported * total) == correct
        print(
            f"{n:>7}  {reported:>19.4f}  {correct / total:>14.4f}  {'yes' if same else 'NO':>4}  "
            f"{' '.join(args.extra)}"
        )


if __name__ == "__main__":
    main()
