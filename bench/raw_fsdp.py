"""The baseline of train.strategy=fsdp: a raw FSDP2 training loop, written the torchtitan way.

The model is built on the meta device, `fully_shard` on each transformer block then on the root
(MixedPrecisionPolicy: bf16 weights, fp32 gradient reduction, fp32 logits), made by
`to_empty` + `init_weights()` where its shards live, fused AdamW, next-token cross-entropy,
torch.compile per block when asked (before sharding, as torchtitan's `apply_compile`), full
activation checkpointing per block when asked. Data: random windows of block_size + 1 tokens of
the same train.bin, read by a DataLoader (2 workers, pinned memory). The model class is expctl's
(`expctl.builtin.gpt.GPT`), so both contenders train the very same network on the same tokens;
nothing else of expctl runs here.

    torchrun --nproc_per_node=4 bench/raw_fsdp.py --root DIR --layers 18 --dim 2048 --heads 16
prints one JSON line: tokens/s over the steps after --warmup, peak GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset

from expctl.builtin.gpt import GPT


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, path: str, block: int, seed: int) -> None:
        self.path, self.block, self.seed = path, block, seed
        self.tokens = os.path.getsize(path) // 2

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start = int(torch.randint(self.tokens - self.block, (), generator=g))
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        w = torch.from_numpy(data[start : start + self.block + 1].astype(np.int64))
        return w[:-1], w[1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--block", type=int, default=2048)
    p.add_argument("--layers", type=int, default=18)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--ac", action="store_true", help="full activation checkpointing per block")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "MASTER_ADDR" not in os.environ:  # one process without torchrun
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    t_ready = time.time()

    with torch.device("meta"):
        model = GPT(args.vocab, args.block, args.layers, args.heads, args.dim)
    for i, block in enumerate(model.blocks):
        if args.ac:
            inner = block.forward

            def forward(*a: Any, _f: Any = inner, **k: Any) -> Any:
                return checkpoint(_f, *a, use_reentrant=False, **k)

            block.forward = forward
        if args.compile:
            model.blocks.register_module(str(i), torch.compile(block))
    mesh = init_device_mesh(device.type, (world,))
    low = torch.bfloat16 if cuda else None
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if cuda else None)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=True)
    root = MixedPrecisionPolicy(
        param_dtype=low,
        reduce_dtype=policy.reduce_dtype,
        output_dtype=torch.float32 if cuda else None,
    )
    fully_shard(model, mesh=mesh, mp_policy=root)
    model.to_empty(device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, fused=cuda)

    data = Windows(os.path.join(args.root, "train.bin"), args.block, seed=rank)
    loader = DataLoader(data, batch_size=args.batch, num_workers=2, pin_memory=cuda)
    batches = iter(loader)
    t0 = 0.0
    for step in range(args.steps):
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
        x, y = (t.to(device, non_blocking=True) for t in next(batches))
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    last = loss.item()
    dt = time.perf_counter() - t0
    tokens = (args.steps - args.warmup) * args.batch * args.block * world / dt
    mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    if rank == 0:
        out = {"tokens_per_s": round(tokens, 1), "max_mem_gib": round(mem, 2), "loss": last}
        print(json.dumps({**out, "t_ready": t_ready, "t_done": time.time()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
