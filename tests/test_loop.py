"""The loop in-process: `rank.main` -> `train.fit` for a couple of steps, and the hooks it calls."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import conftest
import pytest

from expctl import register
from expctl.builtin.data import Splits
from expctl.builtin.datasets.synthetic import synthetic
from expctl.builtin.steps import Supervised
from expctl.config import compose
from expctl.dist import DistEnv
from expctl.errors import Preempted, UserError
from expctl.layout import RunDir
from expctl.rank import entry as rank
from expctl.rank.build import build
from expctl.rank.hooks import Chain, Hooks
from expctl.rank.loopstate import TrainState
from expctl.rank.metrics import score_split

SMALL = [
    *conftest.SMALL,
    "sched=none",
    "train.device=cpu",
    "train.log_every=1",
]


class Recorder(Hooks):
    """Remembers every call; stops at the first validation when told to."""

    def __init__(self, stop_at_validation: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.stop_at_validation = stop_at_validation

    def on_start(self, run_dir: Path) -> None:
        self.calls.append(("start", run_dir))

    def on_validation(self, metrics: dict[str, float], epoch: int, step: int) -> bool:
        self.calls.append(("validation", (epoch, step, sorted(metrics))))
        return self.stop_at_validation

    def on_end(self, metrics: dict[str, Any]) -> None:
        self.calls.append(("end", metrics["status"]))

    def on_failure(self, error: BaseException, returning: bool) -> bool:
        self.calls.append(("failure", type(error).__name__))
        return False


def _cfg(tmp_path: Path, *extra: str) -> Any:
    return compose.compose(None, [*SMALL, f"run.dir={tmp_path / 'run'}", *extra])


def test_two_steps_in_process_write_the_run_and_call_the_hooks(tmp_path: Path) -> None:
    hooks = Recorder()
    run_dir, result = rank.main(_cfg(tmp_path, "train.max_steps=2"), DistEnv(), hooks)
    assert result["step"] == 2 and result["status"] == "completed"
    assert result["val/acc"] == pytest.approx(conftest.synthetic_accuracy(run_dir), abs=1e-6)
    run = RunDir(run_dir)
    assert (
        run.read_result() == json.loads(run.result.read_text()) and run.read_result()["step"] == 2
    )
    assert [r["step"] for r in run.metric_rows() if "train/loss" in r] == [1, 2]
    assert [c[0] for c in hooks.calls] == ["start", "end"], hooks.calls  # max_steps: mid-epoch
    assert run.checkpoint_files()[0].name == "step_000000002.pt"


def test_epochs_are_counted_from_1_everywhere_a_partial_one_too(tmp_path: Path) -> None:
    """From a user trial: `train epoch 2 step 6/6` was followed by `val epoch 1 step 6/6`, and
    the done line said epoch=1 (epoch=0 for a run inside its first epoch). 4 steps an epoch,
    stopped 2 steps into the second: metrics.jsonl, result.json and the log say epoch 2."""
    run_dir, result = rank.main(
        _cfg(tmp_path, "train.max_epochs=3", "train.max_steps=6"), DistEnv()
    )
    rows = RunDir(run_dir).metric_rows()
    assert [(r["step"], r["epoch"], "val/acc" in r) for r in rows] == [
        *((step, 1, False) for step in (1, 2, 3, 4)),
        (4, 1, True),
        (5, 2, False),
        (6, 2, False),
        (6, 2, True),
    ]
    assert result["epoch"] == 2 and json.loads(RunDir(run_dir).result.read_text())["epoch"] == 2
    log = RunDir(run_dir).log.read_text()
    assert "train epoch 1 step 4/6" in log and "val epoch 1 step 4/6" in log
    assert "train epoch 2 step 6/6" in log and "val epoch 2 step 6/6" in log


def test_a_hook_that_asks_to_stop_at_validation_ends_the_run_stopped(tmp_path: Path) -> None:
    hooks = Chain(Hooks(), Recorder(stop_at_validation=True))
    _, result = rank.main(_cfg(tmp_path, "train.max_epochs=3"), DistEnv(), hooks)
    recorder = hooks.hooks[1]
    assert isinstance(recorder, Recorder)
    assert result["status"] == "stopped" and result["epoch"] == 1 and result["step"] == 4
    assert [c[0] for c in recorder.calls] == ["start", "validation", "end"]
    assert recorder.calls[1][1] == (1, 4, ["val/acc", "val/loss"])
    assert "test/acc" not in result


def test_a_run_that_fails_tells_the_hooks(tmp_path: Path) -> None:
    hooks = Recorder()
    with pytest.raises(Exception, match="non-finite"):
        rank.main(_cfg(tmp_path, "train.max_steps=2", "optim.lr=1e30"), DistEnv(), hooks)
    assert hooks.calls[-1] == ("failure", "UserError")


class Monitors(Hooks):
    """Names a validation metric it acts on, as a sweep trial's hook does (`sweep.metric`)."""

    def monitors(self) -> dict[str, str]:
        return {"sweep.metric": "val/accuracy"}


def test_the_metrics_a_hook_monitors_are_checked_before_training(tmp_path: Path) -> None:
    """A hook's monitors are checked like the config's, before the first step; the rank reads
    nothing of a sweep itself: a trial.json and a misspelt sweep.metric without a hook that
    names it train."""
    hooks = Chain(Recorder(), Monitors())
    with pytest.raises(UserError, match="sweep.metric=val/accuracy.*Did you mean 'val/acc'"):
        rank.main(_cfg(tmp_path, "train.max_steps=1"), DistEnv(), hooks)
    assert [c[0] for c in hooks.hooks[0].calls] == ["failure"]  # type: ignore[attr-defined]
    trial = tmp_path / "sweep" / "trial_000"
    trial.mkdir(parents=True)
    RunDir(trial).trial.write_text("{}\n")
    cfg = compose.compose(None, [*SMALL, f"run.dir={trial}", "train.max_steps=1",
                                 "sweep.metric=val/accuracy"])  # fmt: skip
    _, result = rank.main(cfg, DistEnv(), Hooks())
    assert result["status"] == "completed"


def test_a_completed_run_run_again_trains_nothing_and_reports_its_result(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "train.max_steps=2")
    _, first = rank.main(cfg, DistEnv())
    hooks = Recorder()
    _, again = rank.main(cfg, DistEnv(), hooks)
    assert again == first and [c[0] for c in hooks.calls] == ["start", "end"]


def test_limit_val_batches_scores_that_many_batches(tmp_path: Path) -> None:
    import torch

    parts = build(_cfg(tmp_path, "data.val_batch_size=4"), DistEnv(), torch.device("cpu"))
    scored: list[int] = []
    val_step = parts.batch_step.val_step
    parts.batch_step.val_step = lambda ctx, batch: (
        scored.append(len(batch[0])) or val_step(ctx, batch)
    )
    score_split(parts, DistEnv())
    assert scored == [4, 4, 4, 4]  # 16 validation samples
    scored.clear()
    score_split(parts, DistEnv(), limit=2)
    assert scored == [4, 4]


@register("datasets", "synthetic_with_test")
def synthetic_with_test(
    shape: tuple[int, ...] = (6,),
    num_classes: int = 3,
    num_samples: int = 32,
    val_samples: int = 16,
) -> Splits:
    """data=synthetic, its validation split also its test split."""
    splits = synthetic(
        shape=shape, num_classes=num_classes, num_samples=num_samples, val_samples=val_samples
    )
    return dataclasses.replace(splits, test=splits.val)


@pytest.mark.slow  # trains in-process, two runs
def test_limit_val_batches_never_limits_the_test_score(tmp_path: Path) -> None:
    keys = ["data.name=synthetic_with_test", "data.val_batch_size=4", "train.max_steps=3"]
    _, whole = rank.main(_cfg(tmp_path / "a", *keys), DistEnv())
    _, limited = rank.main(_cfg(tmp_path / "b", *keys, "train.limit_val_batches=1"), DistEnv())
    assert limited["val/loss"] != whole["val/loss"], "the validation scored one batch"
    assert limited["test/loss"] == whole["test/loss"] and "test/acc" in limited


@register("steps", "stop_at_step")
class StopAtStep(Supervised):
    """Supervised, but sends this process the stop signal (launcher.signal, USR2) at its
    micro-batch `AT`, counted from when the test sets it."""

    AT = 0

    def train_step(self, ctx: Any, batch: Any) -> Any:
        StopAtStep.AT -= 1
        if StopAtStep.AT == 0:
            os.kill(os.getpid(), signal.SIGUSR2)
        return super().train_step(ctx, batch)


@pytest.mark.slow  # trains in-process, three runs
def test_a_run_stopped_between_two_train_rows_continues_the_same_history(tmp_path: Path) -> None:
    """Stopped at step 5 (rows every 3 steps), then resumed: metrics.jsonl reads as the run
    that was never stopped (the row of step 6 averages steps 4-6), and every event the loggers
    got is in it, the last steps' train row too (step 10: 10 is no multiple of 3)."""
    keys = ["train.step=stop_at_step", "train.log_every=3", "train.max_steps=10", "logger=[csv]"]
    rank.main(_cfg(tmp_path / "ref", *keys), DistEnv(), Recorder())
    StopAtStep.AT = 5
    with pytest.raises(Preempted, match="at step 5"):
        rank.main(_cfg(tmp_path, *keys), DistEnv(), Recorder())
    rank.main(_cfg(tmp_path, *keys), DistEnv(), Recorder())
    ref, run = RunDir(tmp_path / "ref" / "run"), RunDir(tmp_path / "run")

    def history(run: RunDir) -> list[dict[str, Any]]:
        clock = ("time", "perf/samples_per_s")
        return [{k: v for k, v in r.items() if k not in clock} for r in run.metric_rows()]

    assert history(run) == history(ref)
    assert [r["step"] for r in history(ref) if "train/loss" in r] == [3, 6, 9, 10]
    with open(run.csv, newline="") as f:  # what the loggers got: the events (+ result.json's time)
        logged = [{k: float(v) for k, v in r.items() if v} for r in csv.DictReader(f)]
    assert logged.pop() == {
        "step": 10,
        "epoch": 3,  # step 10 of 4-step epochs: the third, counted from 1
        "time/train_s": run.read_result()["time/train_s"],
    }
    assert logged == [{k: float(v) for k, v in r.items() if k != "time"} for r in run.metric_rows()]


@pytest.mark.slow  # trains in-process, three runs
def test_max_steps_alone_decides_the_length_and_the_first_line_says_which_limit_ends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 steps an epoch: max_steps=14 alone trains 14 (Lightning's rule: no epoch limit then);
    with max_epochs=3 as well, 3 epochs end the run first, and its first line says so."""
    _, result = rank.main(_cfg(tmp_path / "a", "train.max_steps=14"), DistEnv())
    assert result["step"] == 14 and "14 steps left (max_steps=14)" in capsys.readouterr().out
    _, result = rank.main(
        _cfg(tmp_path / "b", "train.max_steps=14", "train.max_epochs=3"), DistEnv()
    )
    assert result["step"] == 12
    assert "12 steps left (max_epochs=3 x 4 steps, before max_steps=14)" in capsys.readouterr().out
    _, result = rank.main(_cfg(tmp_path / "c"), DistEnv())
    assert result["step"] == 12 and "(max_epochs=3 x 4 steps)" in capsys.readouterr().out


def test_train_state_round_trips_through_its_state_dict() -> None:
    state = TrainState(step=7, epoch=2, batch=3, val={"val/acc": 0.5}, train={"train/loss": 1.0})
    other = TrainState()
    other.load_state_dict(state.state_dict())
    assert other == state


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), None])
def test_a_nonfinite_gradient_anywhere_is_found(bad: float | None) -> None:
    """train.on_nan=skip asks whether every gradient is finite (torch's public norm API)."""
    import torch

    from expctl.builtin.steps import StepContext

    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    params[0].grad = torch.full((3,), 1e30)  # large but finite: never mistaken for overflow
    params[1].grad = torch.tensor([1.0, 2.0 if bad is None else bad])
    opt = torch.optim.SGD(params, lr=0.1)
    assert StepContext._finite(opt) is (bad is None)


@pytest.mark.slow
@pytest.mark.parametrize("every", [4, 1, 0])
def test_the_loop_runs_the_cycle_collector_at_the_same_steps_on_every_rank(
    tmp_path: Path, every: int
) -> None:
    """train.gc_every=N: Python's automatic collection is off while the loop runs, and the young
    generations are collected after every N-th step and all of them after every 20th collection
    (so ranks pause together, not one after another at each all-reduce); it is on again after
    the run. 0: Python's own schedule."""
    import gc

    import gcprobe

    assert gc.isenabled()
    gcprobe.reset()
    try:
        cfg = _cfg(tmp_path, "imports=[gcprobe]", "train.step=gcprobe", "train.max_steps=22", "train.max_epochs=50",
                   f"train.gc_every={every}", "train.log_every=100")  # fmt: skip
        rank.main(cfg, DistEnv(), Recorder())
    finally:
        gcprobe.stop()
    assert gc.isenabled()
    assert len(gcprobe.ENABLED) == 22
    if every:
        assert not any(gcprobe.ENABLED)
        during = [c for c in gcprobe.COLLECTED if c[0] < 22]  # before the last step
        # the young generations every `every` steps; every 20th collection a full one
        assert during == [(s, 2 if s % (20 * every) == 0 else 1) for s in range(every, 22, every)]
    else:
        assert all(gcprobe.ENABLED)


def test_a_collector_the_user_turned_off_stays_off(tmp_path: Path) -> None:
    """gc.disable() before the run (a user who manages collection): the loop neither turns it
    on nor collects, even at train.gc_every's steps."""
    import gc

    import gcprobe

    gcprobe.reset()
    gc.disable()
    try:
        cfg = _cfg(tmp_path, "imports=[gcprobe]", "train.step=gcprobe", "train.max_steps=3",
                   "train.gc_every=1", "train.log_every=100")  # fmt: skip
        rank.main(cfg, DistEnv(), Recorder())
        assert not gc.isenabled()
    finally:
        gc.enable()
        gcprobe.stop()
    assert gcprobe.ENABLED == [False, False, False]
    assert gcprobe.COLLECTED == []  # and the loop collects nothing either


@pytest.mark.slow
def test_data_workers_started_while_the_loop_collects_keep_pythons_collector(
    tmp_path: Path,
) -> None:
    """The loop turns automatic collection off in its own process only: a DataLoader worker,
    forked from it while it runs, keeps Python's schedule (the loop does not collect in it)."""
    import gcprobe

    gcprobe.LOADED.clear()
    cfg = compose.compose(None, [
        "imports=[gcprobe]", "model=mlp", "model.hidden=[4]", "data.name=gcflags",
        "data.batch_size=8", "data.num_workers=1", "train.step=gcflagprobe", "train.max_steps=6",
        "train.max_epochs=2", "sched=none", "train.device=cpu", f"run.dir={tmp_path / 'run'}",
    ])  # fmt: skip
    rank.main(cfg, DistEnv(), Recorder())
    assert len(gcprobe.LOADED) == 48 and all(f == 1.0 for f in gcprobe.LOADED)


@pytest.mark.slow
def test_a_run_resumes_with_another_gc_every_or_data_loading(tmp_path: Path) -> None:
    """train.gc_every decides when Python collects, not what is computed: changing it does not
    make the run directory another run's."""
    rank.main(_cfg(tmp_path, "train.max_steps=4", "train.gc_every=7"), DistEnv(), Recorder())
    _, result = rank.main(
        _cfg(tmp_path, "train.max_steps=8", "train.max_epochs=5", "train.gc_every=0"),
        DistEnv(),
        Recorder(),
    )
    assert result["step"] == 8
    # nor how samples are read (the corrupt-file error's hint says on_corrupt=skip)
    more = ["data.num_workers=1", "data.timeout=60", "data.pin_memory=false"]
    _, result = rank.main(
        _cfg(tmp_path, "train.max_steps=10", "train.max_epochs=5", *more), DistEnv(), Recorder()
    )
    assert result["step"] == 10


@pytest.mark.slow  # trains in-process, three runs
def test_a_sharded_run_on_one_rank_resumes_exactly_from_its_checkpoint_folder(
    tmp_path: Path,
) -> None:
    """train.strategy=fsdp on one rank (nothing to split, the same checkpoint format): each
    checkpoint is a folder of DCP's files whose manifest lists every one, load_model reads it
    into one process (the score it reports is the saved model's), and a run continued from it
    ends with bitwise the weights of one never stopped."""
    import torch

    from expctl.rank import checkpoint

    fsdp = ["train.strategy=fsdp", "optim=adamw"]
    run_dir, first = rank.main(_cfg(tmp_path, *fsdp, "train.max_steps=2"), DistEnv())
    (folder,) = RunDir(run_dir).checkpoint_files()
    assert folder.name == "step_000000002.dcp" and folder.is_dir()
    listed = {line.split()[1] for line in (folder.parent / f"{folder.name}.sha256").open()}
    assert listed == {f"{folder.name}/{f.name}" for f in folder.iterdir()} and len(listed) >= 3
    assert first["val/acc"] == pytest.approx(conftest.synthetic_accuracy(run_dir), abs=1e-6)
    _, more = rank.main(_cfg(tmp_path, *fsdp, "train.max_steps=6"), DistEnv())
    assert more["step"] == 6 and "resumed from" in (run_dir / "train.log").read_text()
    ref_dir, _ = rank.main(_cfg(tmp_path / "ref", *fsdp, "train.max_steps=6"), DistEnv())
    got, ref = (checkpoint.pick(d, "last")[1]["models"]["model"] for d in (run_dir, ref_dir))
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)


def _blocks_model() -> Any:
    from torch import nn

    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6)) for _ in range(3)
            )
            self.head = nn.Linear(6, 3)

        def forward(self, x: Any) -> Any:
            for b in self.blocks:
                x = x + b(x)
            return self.head(x)

    return Blocks()


@pytest.mark.parametrize(
    "mode, compiled", [("full", False), ("selective", False), ("full", True), ("selective", True)]
)
def test_activation_checkpointing_keeps_the_gradients_and_the_parameter_names(
    mode: str, compiled: bool, tmp_path: Path
) -> None:
    """Each block's activations recomputed in the backward (a model's `blocks`): the same
    gradients as without, and the same state-dict keys (checkpoints stay interchangeable).
    Under fsdp with train.compile each checkpointed block is compiled on its own, and
    torch.compile traces the checkpoint (it refused a context_fn held in a variable)."""
    import torch

    from expctl.rank import strategy

    torch.manual_seed(0)
    plain, checkpointed = _blocks_model(), _blocks_model()
    checkpointed.load_state_dict(plain.state_dict())
    extra = ["train.strategy=fsdp", "train.compile=true"] if compiled else []
    cfg = _cfg(tmp_path, f"train.activation_checkpointing={mode}", *extra)
    strategy.prepare(cfg, {"model": checkpointed}, DistEnv(), torch.device("cpu"), "32")
    assert all(b.forward != type(b).forward for b in checkpointed.blocks)
    x = torch.randn(4, 6)
    for m in (plain, checkpointed):
        m(x).pow(2).sum().backward()
    assert list(checkpointed.state_dict()) == list(plain.state_dict())
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_the_blocks_fsdp_shards_each_come_from_the_model_or_its_family() -> None:
    """A model's `blocks`, else torchvision ResNet's stages and ViT's encoder layers, else none
    (the model is sharded whole)."""
    from torch import nn
    from torchvision.models import VisionTransformer, resnet18

    from expctl.rank.strategy import blocks

    assert len(blocks(_blocks_model())) == 3
    net = resnet18()
    assert blocks(net) == [net.layer1, net.layer2, net.layer3, net.layer4]
    vit = VisionTransformer(8, 4, num_layers=2, num_heads=1, hidden_dim=8, mlp_dim=8)
    assert blocks(vit) == list(vit.encoder.layers)
    assert blocks(nn.Sequential(nn.Linear(2, 2))) == []


@register("models", "meta_mlp", inferred=("input_shape", "num_classes"))
def meta_mlp(
    input_shape: tuple[int, ...] = (6,),
    num_classes: int = 3,
    hidden: tuple[int, ...] = (8,),
    init: bool = True,
) -> Any:
    """An MLP built on the meta device (shapes only), made by its init_weights(), which also
    fills a buffer no state dict holds."""
    import torch
    from torch import nn

    class MetaMLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(input_shape[0], hidden[0])])
            self.head = nn.Linear(hidden[0], num_classes)
            self.register_buffer("scale", torch.empty(1), persistent=False)

        def forward(self, x: Any) -> Any:
            return self.head(torch.relu(self.blocks[0](x))) * self.scale

    if init:
        MetaMLP.init_weights = lambda self: [  # type: ignore[attr-defined]
            *(m.reset_parameters() for m in (*self.blocks, self.head)),
            self.scale.fill_(1.0),
        ]
    with torch.device("meta"):
        return MetaMLP()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_model_built_on_the_meta_device_is_made_by_its_init_weights(
    strategy: str, tmp_path: Path
) -> None:
    """As torchtitan builds a large model: shapes on the meta device, memory and values after
    sharding (`init_weights()`); load_model makes it the same way before loading the weights.
    Without init_weights(): refused in one line."""
    keys = ["model=meta_mlp", f"train.strategy={strategy}", "train.max_steps=2"]
    run_dir, result = rank.main(_cfg(tmp_path, *keys), DistEnv())
    assert result["val/acc"] == pytest.approx(conftest.synthetic_accuracy(run_dir), abs=1e-6)
    with pytest.raises(UserError, match="built on the meta device but has no init_weights"):
        rank.main(_cfg(tmp_path / "no", *keys, "model.init=false"), DistEnv())
