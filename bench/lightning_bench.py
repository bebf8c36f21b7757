"""PyTorch Lightning's Trainer with its default settings, on the same model, data and precision.

Only what the comparison needs is set (devices, precision, max_steps); logging, checkpointing,
the progress bar and the model summary stay as Lightning ships them. Prints one JSON line:
samples/s over the steps after --warmup (timed by a callback, CUDA synchronised).

    python bench/lightning_bench.py --model resnet18 --shape 3x32x32 --batch 512 --precision bf16
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name, as on the GPU image
    import pytorch_lightning as pl  # type: ignore[no-redef]

from raw_ddp import build, common_args  # same network, same tensors, same flags


class Module(pl.LightningModule):
    def __init__(self, model: torch.nn.Module, optim: str) -> None:
        super().__init__()
        self.model, self.optim = model, optim
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optim == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Timer(pl.Callback):
    def __init__(self, warmup: int) -> None:
        self.warmup, self.t0, self.t1 = warmup, 0.0, 0.0

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.warmup and not self.t0:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

    def on_train_end(self, trainer: Any, module: Any) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.t1 = time.perf_counter()


def main() -> None:
    p = common_args()
    p.add_argument("--devices", type=int, default=1)
    args = p.parse_args()

    model, dataset = build(args)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, shuffle=True, drop_last=True
    )
    timer = Timer(args.warmup)
    trainer = pl.Trainer(
        devices=args.devices,
        max_steps=args.steps,
        precision="bf16-mixed" if args.precision == "bf16" else "32-true",
        callbacks=[timer],
    )
    trainer.fit(Module(model, args.optim), loader)
    if trainer.global_rank == 0:
        timed = args.steps - args.warmup
        elapsed = timer.t1 - timer.t0
        world = trainer.world_size
        print(
            json.dumps(
                {
                    "samples_per_s": timed * args.batch * world / elapsed,
                    "ms_per_step": 1000 * elapsed / timed,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
