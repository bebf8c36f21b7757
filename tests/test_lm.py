"""Language models: model=gpt (built on the meta device, initialised after), data=tokens (random
windows seeded per sample, fixed validation windows), the lm step's rows, resume and reported ==
saved."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import expctl as run_cli

import expctl
from expctl import registry
from expctl.builtin.datasets.tokens import TokenWindows, largest, tokens
from expctl.builtin.gpt import GPT, gpt
from expctl.builtin.reader import Loading, Reader
from expctl.builtin.steps import LanguageModel, bf16_peak
from expctl.config import compose
from expctl.config import frozen as config
from expctl.dist import DistEnv
from expctl.errors import UserError
from expctl.layout import RunDir
from expctl.rank import checkpoint, retention
from expctl.rank import entry as rank
from expctl.rank.build import build

SIZES = {"vocab_size": 50, "block_size": 16, "n_layer": 2, "n_head": 2, "d_model": 16}
# a GPT of 1 block on 16-token windows of our own files: 3 steps an epoch (12 windows, batch 4)
TINY_LM = [
    "experiment=gpt_tiny",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=16",
    "model.dropout=0.1",
    "data.block_size=16",
    "data.vocab_size=null",
    "data.batch_size=4",
    "data.num_workers=0",
    "sched=none",
    "train.device=cpu",
    "train.log_every=1",
]


def token_files(folder: Path, train: int = 200, val: int = 70, dtype: Any = np.uint16) -> Path:
    """train.bin and val.bin of random ids below 50."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        rng.integers(0, 50, n).astype(dtype).tofile(folder / f"{split}.bin")
    return folder


@pytest.mark.parametrize("pos", ["rotary", "learned"])
def test_gpt_built_on_meta_and_initialised_after_has_the_weights_of_a_direct_build(
    pos: str,
) -> None:
    """torchtitan's path (meta device, to_empty, init_weights) and a plain construction draw
    the same values for a seed; the blocks are a ModuleList; the output layer is the embedding."""
    torch.manual_seed(7)
    direct = GPT(**SIZES, pos=pos)
    with torch.device("meta"):
        late = GPT(**SIZES, pos=pos)
    assert all(p.is_meta for p in late.parameters())
    torch.manual_seed(7)
    late.to_empty(device="cpu")
    late.init_weights()
    torch.manual_seed(7)
    factory = gpt(**SIZES, pos=pos)
    for other in (late, factory):
        assert all(
            torch.equal(a, b)
            for a, b in zip(direct.state_dict().values(), other.state_dict().values(), strict=True)
        )
    assert isinstance(direct.blocks, torch.nn.ModuleList) and len(direct.blocks) == 2
    assert not any("head" in k for k in direct.state_dict()), "tied: no output weight"
    logits = direct(torch.randint(0, 50, (3, 16)))
    assert logits.shape == (3, 16, 50)
    # PaLM's 6 N + 12 L d T, N without the position table (none with rotary positions)
    n = sum(p.numel() for p in direct.parameters()) - (16 * 16 if pos == "learned" else 0)
    assert direct.flops_per_token() == 6 * n + 12 * 2 * 16 * 16


def test_gpt_positions_are_causal() -> None:
    """A later token never changes an earlier position's logits."""
    model = gpt(**SIZES).eval()
    x = torch.randint(0, 50, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 50
    assert torch.allclose(model(x)[0, :10], model(y)[0, :10], atol=1e-6)


def test_the_build_path_gives_the_weights_of_the_model_made_directly(tmp_path: Path) -> None:
    """build() (the DDP path) makes the data first: drawing its windows takes nothing from the
    seeded generator, so the model is the one `gpt(...)` makes after torch.manual_seed."""
    root = token_files(tmp_path / "tok")
    cfg = compose.compose(None, [*TINY_LM, f"data.root={root}", "train.seed=3"])
    parts = build(cfg, DistEnv(), torch.device("cpu"))
    try:
        assert parts.model_args["block_size"] == 16 and parts.model_args["vocab_size"] == 50
        torch.manual_seed(3)
        made = gpt(**parts.model_args).state_dict()
        built = parts.models["model"].state_dict()
        assert all(torch.equal(made[k], built[k]) for k in made)
    finally:
        parts.close()


def test_token_windows_are_shifted_by_one_drawn_per_sample_and_fixed_in_validation(
    tmp_path: Path,
) -> None:
    ids = np.arange(70_000, 70_000 + 500, dtype=np.uint32)  # beyond uint16
    root = tmp_path / "tok"
    root.mkdir()
    ids.tofile(root / "train.bin")
    ids[:100].tofile(root / "val.bin")
    splits = tokens(str(root), dtype="uint32", block_size=16)
    assert splits.info.input_shape == (16,) and splits.info.num_classes == 70_500
    assert largest(root / "train.bin", "uint32") == 70_499  # from the cache the second time
    val = splits.val
    assert isinstance(val, TokenWindows) and len(val) == 99 // 16
    x, y = val[2]
    assert x[0] == 70_032 and torch.equal(y, x + 1) and x.dtype == torch.int64
    rng = torch.get_rng_state()
    splits.train[0]
    assert torch.equal(torch.get_rng_state(), rng), "the global generator is not drawn from"

    def starts(seed: int, epoch: int) -> list[int]:
        reader = Reader({"train": splits.train}, Loading(), seed, 0)
        (batch,) = reader.read("train", epoch, [list(range(8))])
        assert torch.equal(batch[1], batch[0] + 1)
        return (batch[0][:, 0] - 70_000).tolist()

    assert starts(1, 0) == starts(1, 0) != starts(1, 1) != starts(2, 0)
    assert len(set(starts(1, 0))) > 1 and all(0 <= s <= 500 - 17 for s in starts(1, 0))


def test_the_lm_steps_rows_add_perplexity_and_throughput() -> None:
    step = LanguageModel()
    assert step.derived({"val/loss": 1.0}) == {"val/ppl": math.e}
    assert step.derived({"test/loss": 1e4}) == {"test/ppl": math.inf}
    step.tokens, step.flops, step.peak = 64, 1000, 2 * 989e12
    row = step.derived({"train/loss": 2.0, "perf/samples_per_s": 10.0})
    assert row == {"perf/tokens_per_s": 640.0, "perf/mfu": round(640 * 1000 / (2 * 989e12), 4)}
    step.peak = None  # a CPU, or a GPU of unknown peak: no MFU
    assert "perf/mfu" not in step.derived({"perf/samples_per_s": 10.0})
    assert bf16_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert bf16_peak("NVIDIA H100 PCIe") == 756e12 and bf16_peak("NVIDIA H200") == 989e12
    assert bf16_peak("NVIDIA A10G") is None


def test_a_model_value_the_data_also_takes_must_be_the_datas() -> None:
    with pytest.raises(UserError, match=r"model.block_size=32, but data.block_size is 64"):
        compose.compose(None, ["experiment=gpt_tiny", "model.block_size=32"])
    with pytest.raises(UserError, match=r"data.vocab_size is null \(the data's own\)"):
        compose.compose(
            None, ["experiment=gpt_tiny", "data.vocab_size=null", "model.vocab_size=300"]
        )
    same = compose.compose(None, ["experiment=gpt_tiny", "model.block_size=64"])
    assert same.model.args["block_size"] == 64


@pytest.mark.slow  # trains in-process, three runs
def test_a_resumed_lm_run_sees_the_windows_of_an_uninterrupted_one(tmp_path: Path) -> None:
    """Stopped after 5 steps (mid-epoch: 3 steps an epoch), continued to 8: the same losses,
    bitwise, and the same weights as 8 steps in one go (random windows and dropout); the
    derived val/ppl can be monitored."""
    root = token_files(tmp_path / "tok")
    common = [*TINY_LM, f"data.root={root}", "checkpoint.monitor=val/ppl"]
    rank.main(
        compose.compose(None, [*common, "train.max_steps=8", f"run.dir={tmp_path / 'a'}"]),
        DistEnv(),
    )
    cut = [*common, f"run.dir={tmp_path / 'b'}"]
    rank.main(compose.compose(None, [*cut, "train.max_steps=5"]), DistEnv())
    rank.main(compose.compose(None, [*cut, "train.max_steps=8"]), DistEnv())

    def losses(run: str) -> list[tuple[int, float]]:
        rows = RunDir(tmp_path / run).metric_rows()
        return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]

    assert losses("a") == losses("b") and [s for s, _ in losses("a")] == list(range(1, 9))
    a, b = (retention.list_checkpoints(tmp_path / r)[0] for r in ("a", "b"))
    wa, wb = (checkpoint.load(p)["models"]["model"] for p in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow  # two workers over gloo
# fsdp: the GPT built on the meta device, made before it is sharded (on the CPU), its blocks
# sharded on their own with selective activation checkpointing, a checkpoint folder of shards
@pytest.mark.parametrize(
    "strategy", [[], ["train.strategy=fsdp", "train.activation_checkpointing=selective"]]
)
def test_two_workers_report_the_saved_lms_validation_loss(
    tmp_path: Path, strategy: list[str]
) -> None:
    """val/loss in result.json, from 2 ranks' shards of the validation windows, is the loss of
    the model load_model returns on those windows; val/ppl is its exponential; loss falls."""
    root = token_files(tmp_path / "tok", train=400, val=200)
    run_cli(
        "run",
        *TINY_LM,
        f"data.root={root}",
        "train.max_steps=12",
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=lm",
        *strategy,
        cwd=tmp_path,
    )
    run_dir = tmp_path / "lm"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["val/loss"] == pytest.approx(_saved_models_val_loss(run_dir), rel=1e-5)
    assert result["val/ppl"] == pytest.approx(math.exp(result["val/loss"]))
    made_after = "built on the meta device, made on cpu" in (run_dir / "train.log").read_text()
    assert made_after == bool(strategy)
    rows = [r for r in RunDir(run_dir).metric_rows() if "train/loss" in r]
    assert rows[-1]["train/loss"] < rows[0]["train/loss"] and "perf/tokens_per_s" in rows[0]


def _saved_models_val_loss(run_dir: Path) -> float:
    """The loss of the model `load_model` returns on the run's validation windows."""
    cfg = config.load(run_dir)
    val = registry.get("datasets", "tokens").factory(**cfg.data.args).val
    x = torch.stack([val[i][0] for i in range(len(val))])
    y = torch.stack([val[i][1] for i in range(len(val))])
    with torch.no_grad():
        logits = expctl.load_model(run_dir)(x)
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))


@pytest.mark.slow  # two torchrun agents of two workers each, over gloo
def test_hsdp_over_two_nodes_shards_within_and_replicates_across(tmp_path: Path) -> None:
    """train.strategy=hsdp with two torchrun agents on this machine (two "nodes" of two ranks):
    a (replicate 2, shard 2) mesh, a checkpoint folder of shards, and the saved model scores
    the validation loss the run reported."""
    import socket
    import subprocess
    import sys

    from conftest import cli_env

    root = token_files(tmp_path / "tok", train=400, val=200)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "hsdp"
    agent = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=hsdp",
        "-m", "expctl", "run", *TINY_LM, f"data.root={root}", "train.max_steps=6",
        "train.strategy=hsdp", f"run.dir={run_dir}",
    ]  # fmt: skip
    kw: dict[str, Any] = {"env": cli_env(), "cwd": tmp_path, "text": True}
    kw.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    nodes = [subprocess.Popen(agent, **kw) for _ in range(2)]
    outs = [node.communicate(timeout=600) for node in nodes]
    assert [n.returncode for n in nodes] == [0, 0], outs
    log = (run_dir / "train.log").read_text()
    assert "train.strategy=hsdp: mesh {'replicate': 2, 'shard': 2}" in log
    assert list((run_dir / "checkpoints").glob("step_000000006.dcp"))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["val/loss"] == pytest.approx(_saved_models_val_loss(run_dir), rel=1e-5)
