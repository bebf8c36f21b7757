"""After training (issue 13), on real tiny runs: best checkpoints by a metric, early stopping on
two DDP workers, validation every N steps, ReduceLROnPlateau resumed exactly, weights-only
starts, `expctl eval`, a changed run length on resume, and training time over attempts."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import conftest
import pytest
import torch
from conftest import cli_env, synthetic_accuracy
from conftest import expctl as run_cli

import expctl
from expctl import registry
from expctl.config import frozen as config
from expctl.errors import UserError
from expctl.layout import RunDir
from expctl.rank import checkpoint, retention

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow

# 4 optimizer steps per epoch on one rank (32 samples, batch 8), 2 on two
SMALL = [*conftest.SMALL, "sched=none", "train.device=cpu", "train.log_every=1"]


def val_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in RunDir(run_dir).metric_rows() if "val/loss" in r]


def weights(path: Path) -> dict[str, torch.Tensor]:
    return dict(checkpoint.load(path)["models"]["model"])


def val_loss(model: torch.nn.Module, run_dir: Path) -> float:
    """The model's mean cross-entropy on the run's validation split, computed here."""
    cfg = config.load(run_dir)
    x, y = registry.get("datasets", cfg.data.name).factory(**cfg.data.args).val.tensors
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def test_best_k_checkpoints_are_kept_and_load_model_returns_the_best(tmp_path: Path) -> None:
    """checkpoint.monitor=val/loss, keep=2: the two lowest val/loss of metrics.jsonl and the
    newest stay; load_model's default (and which="best") is the lowest one's weights."""
    run = tmp_path / "r"
    monitor = ["checkpoint.monitor=val/loss", "checkpoint.keep=2", "train.val_every_steps=2"]
    expctl.run(None, [*SMALL, "optim.lr=0.5", "train.max_epochs=6", *monitor, f"run.dir={run}"])
    rows = sorted(val_rows(run), key=lambda r: (r["val/loss"], -r["step"]))
    newest = max(r["step"] for r in rows)
    assert rows[0]["step"] != newest, "the test needs a best that is not the last"
    kept = {checkpoint.path_for(run, s) for s in (rows[0]["step"], rows[1]["step"], newest)}
    assert set(retention.list_checkpoints(run)) == kept
    best = expctl.load_model(run)
    assert val_loss(best, run) == pytest.approx(rows[0]["val/loss"], rel=1e-5)
    assert all(
        torch.equal(v, weights(checkpoint.path_for(run, rows[0]["step"]))[k])
        for k, v in expctl.load_model(run, which="best").state_dict().items()
    )
    last = expctl.load_model(run, which="last")
    assert val_loss(last, run) == pytest.approx(val_rows(run)[-1]["val/loss"], rel=1e-5)
    by_path = expctl.load_model(run, checkpoint=checkpoint.path_for(run, newest))
    assert val_loss(by_path, run) == val_loss(last, run)
    with pytest.raises(expctl.UserError, match="not both"):
        expctl.load_model(run, checkpoint=checkpoint.path_for(run, newest), which="best")


def _stop_epoch(values: list[float], patience: int, min_delta: float) -> int:
    """Early stopping (mode min) replayed on the logged val/loss series: the epoch it ends."""
    best, stall = None, 0
    for epoch, value in enumerate(values, 1):
        if best is None or best - value > min_delta:
            best, stall = value, 0
        else:
            stall += 1
        if stall >= patience:
            return epoch
    return len(values)


def test_early_stopping_ends_both_ddp_workers_at_the_same_epoch(tmp_path: Path) -> None:
    """Two gloo workers stop where the rule, replayed on metrics.jsonl, says, before
    max_epochs; the first log line names the local launcher; running it again trains nothing."""
    args = [
        "run",
        *SMALL,
        "optim.lr=0.5",
        "train.max_epochs=12",
        "train.early_stop.monitor=val/loss",
        "train.early_stop.patience=2",
        "train.early_stop.min_delta=0.01",
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=es",
    ]
    run_cli(*args, cwd=tmp_path)
    run = tmp_path / "es"
    result = json.loads((run / "result.json").read_text())
    losses = [r["val/loss"] for r in val_rows(run)]
    assert result["epoch"] == _stop_epoch(losses, 2, 0.01) == len(losses) < 12
    assert result["stopped_early"] is True and result["status"] == "completed"
    log = (run / "train.log").read_text()
    assert "local x 2 rank(s)" in log and "torchrun" not in log
    assert "early stop: val/loss has not improved" in log
    assert "already completed" in run_cli(*args, cwd=tmp_path).stdout  # stopped early: done


def test_validation_every_n_steps_lands_in_metrics_jsonl(tmp_path: Path) -> None:
    run = tmp_path / "v"
    expctl.run(None, [*SMALL, "train.max_epochs=2", "train.val_every_steps=3", f"run.dir={run}"])
    assert [(r["step"], r["epoch"]) for r in val_rows(run)] == [(3, 1), (4, 1), (6, 2), (8, 2)]


def test_reduce_lr_on_plateau_lowers_the_lr_and_resumes_exactly(tmp_path: Path) -> None:
    """sched=reducelronplateau (patience 0, an improvement must beat the best by 10): the lr
    drops tenfold after each validation from the second on; killed mid-epoch 3 and resumed,
    the run ends with the same weights and the same lr history."""
    args = [
        "run",
        *SMALL,
        "imports=[faulty]",
        "train.step=kill_at_step",
        "checkpoint.every=3",
        "train.max_epochs=4",
        "sched=reducelronplateau",
        "sched.patience=0",
        "sched.threshold=10",
        "sched.threshold_mode=abs",
    ]
    run_cli(*args, "run.dir=ref", cwd=tmp_path)
    killed = run_cli(
        *args, "run.dir=cut", cwd=tmp_path, env=cli_env(KILL_AT_STEP="11"), check=False
    )
    assert killed.returncode == -9, killed.stderr
    resumed = run_cli(*args, "run.dir=cut", cwd=tmp_path)
    assert "(step 9, epoch 3, batch 1)" in resumed.stdout
    lrs = {
        name: [r["lr"] for r in RunDir(tmp_path / name).metric_rows() if "lr" in r]
        for name in ("ref", "cut")
    }
    assert lrs["ref"] == pytest.approx([0.05] * 8 + [0.005] * 4 + [0.0005] * 4)
    assert lrs["cut"] == lrs["ref"]
    a, b = (weights(retention.list_checkpoints(tmp_path / n)[0]) for n in ("ref", "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_init_starts_from_weights_only_and_says_what_did_not_fit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint.init from an expctl checkpoint, a run directory or a plain state-dict file:
    with lr 0 one step keeps those weights exactly, at step 1 (not the source's step);
    init_strict=false loads what fits and lists the rest; strict refuses."""
    source = tmp_path / "src"
    expctl.run(None, [*SMALL, "train.max_epochs=1", f"run.dir={source}"])
    trained = weights(retention.list_checkpoints(source)[0])
    plain = tmp_path / "plain.pt"
    torch.save(expctl.load_model(source).state_dict(), plain)
    start = [*SMALL, "optim.lr=0", "train.max_steps=1"]
    for i, init in enumerate((retention.list_checkpoints(source)[0], source, plain)):
        result = expctl.run(None, [*start, f"checkpoint.init={init}", f"run.dir={tmp_path}/{i}"])
        assert result["step"] == 1
        got = weights(retention.list_checkpoints(tmp_path / str(i))[0])
        assert all(torch.equal(got[k], trained[k]) for k in trained), init
    wider = [*start, "model.hidden=[8,8]", f"checkpoint.init={plain}"]
    with pytest.raises(expctl.UserError, match="missing 2: 5.weight, 5.bias"):
        expctl.run(None, [*wider, f"run.dir={tmp_path}/strict"])
    assert not (tmp_path / "strict").exists()
    expctl.run(None, [*wider, "checkpoint.init_strict=false", f"run.dir={tmp_path}/loose"])
    got = weights(retention.list_checkpoints(tmp_path / "loose")[0])
    assert torch.equal(got["1.weight"], trained["1.weight"])
    log = (tmp_path / "loose" / "train.log").read_text()
    assert "not loaded: model 'model' other shape 2: 3.weight [3, 8] there, [8, 8] here" in log


def test_eval_writes_its_json_and_matches_the_runs_validation(tmp_path: Path) -> None:
    """`expctl eval` of the best and the last checkpoint, inline and with 2 local workers: the
    same val/acc and val/loss the run logged for those weights; other splits and data too."""
    args = [*SMALL, "train.max_epochs=3", "optim.lr=0.5", "checkpoint.monitor=val/acc"]
    run_cli("run", *args, "checkpoint.mode=max", "run.dir=r", cwd=tmp_path)
    run = tmp_path / "r"
    best = max(val_rows(run), key=lambda r: (r["val/acc"], r["step"]))
    proc = run_cli("eval", str(run), cwd=tmp_path)
    record = json.loads(RunDir(run).eval_result(f"val-step_{best['step']:09d}").read_text())
    assert record["step"] == best["step"] and record["split"] == "val"
    assert (record["val/acc"], record["val/loss"]) == (best["val/acc"], best["val/loss"])
    assert f"val of step {best['step']}" in proc.stdout
    last = json.loads((run / "result.json").read_text())
    ddp = ["--which", "last", "--name", "ddp", "launcher=local", "launcher.nproc=2"]
    run_cli("eval", str(run), *ddp, cwd=tmp_path)
    record = json.loads(RunDir(run).eval_result("ddp").read_text())
    assert record["val/acc"] == last["val/acc"]
    assert record["val/loss"] == pytest.approx(last["val/loss"], rel=1e-6)
    other = expctl.evaluate(run, split="train", which="last", overrides=["data.num_samples=48"])
    assert other["step"] == last["step"]
    train_acc = synthetic_accuracy(run, "train", num_samples=48)
    assert other["train/acc"] == pytest.approx(train_acc, abs=1e-6)
    assert other["overrides"] == ["data.num_samples=48"] and other["name"].startswith("train-")
    # a batch larger than the training split: no training batch is taken, so no refusal
    wide = ["data.num_samples=48", "data.batch_size=100", "train.grad_accum=3"]
    whole = expctl.evaluate(run, split="train", which="last", overrides=wide)
    assert whole["train/acc"] == other["train/acc"]
    with pytest.raises(UserError, match="larger than the 48 training samples"):
        expctl.run(overrides=[*SMALL, *wide[:2], f"run.dir={tmp_path / 'r2'}"])
    with pytest.raises(UserError, match="has no test split") as missing:
        expctl.evaluate(run, split="test")
    assert missing.value.hint == "pick another split: --split val or train"
    with pytest.raises(UserError, match="does not fit this config's models") as unfit:
        expctl.evaluate(run, overrides=["data.num_classes=5"])  # the run's data has 3
    assert "as many classes and channels as it trained on" in str(unfit.value.hint)

    # a read-only run directory (a read-only bind mount: root writes through chmod) is said
    # before anything is scored, in one line, exit 2
    if os.geteuid() == 0 and shutil.which("unshare"):
        readonly = f"mount --bind {run} {run} && mount -o remount,ro,bind {run} {run}"
        cmd = f"{readonly} && {shlex.quote(sys.executable)} -m expctl eval {run} --name ro"
        proc = subprocess.run(
            ["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, env=cli_env()
        )
        if "unshare failed" not in proc.stderr and "mount:" not in proc.stderr:
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert f"score into {run / 'eval'}, but it is not writable" in proc.stderr
            assert "val of step" not in proc.stdout, "nothing was scored"


def test_a_changed_run_length_refuses_a_schedule_built_for_the_old_one(tmp_path: Path) -> None:
    """A finished cosine run continued with more epochs would jump its learning rate: refused,
    with the two ways on; a schedule that does not know the run's length continues."""
    for sched in ("cosine", "none"):
        args = [
            *conftest.SMALL,
            "train.device=cpu",
            f"sched={sched}",
            f"run.dir={tmp_path / sched}",
        ]
        expctl.run(None, [*args, "train.max_epochs=1"])
        if sched == "cosine":
            with pytest.raises(
                expctl.UserError, match="built for 4 steps, this config makes the run 8"
            ):
                expctl.run(None, [*args, "train.max_epochs=2"])
        else:
            assert expctl.run(None, [*args, "train.max_epochs=2"])["epoch"] == 2


def test_train_time_sums_every_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 slow steps (0.1 s each), then the run continued to 8: time/train_s counts both."""
    monkeypatch.setenv("SLOW_STEP_S", "0.1")
    args = [*SMALL, "imports=[faulty]", "train.step=slow", f"run.dir={tmp_path / 't'}"]
    first = expctl.run(None, [*args, "train.max_steps=4"])
    assert first["time/train_s"] >= 0.4
    kept = checkpoint.load(retention.list_checkpoints(tmp_path / "t")[0])["train_s"]
    assert 0.4 <= kept <= first["time/train_s"]  # what the continued run starts from
    second = expctl.run(None, [*args, "train.max_steps=8"])
    # not first's figure + 0.4: first's also counts what followed its last checkpoint
    assert second["time/train_s"] >= kept + 0.4
    assert checkpoint.load(retention.list_checkpoints(tmp_path / "t")[0])["train_s"] >= 0.8


def test_a_resume_mid_epoch_on_other_ranks_says_once_that_the_epoch_is_dealt_afresh(
    tmp_path: Path,
) -> None:
    """One rank stops inside epoch 1 (step 1 of 4 an epoch); two ranks continue: the warning
    says, once (not once per rank), that the rest of that epoch is dealt afresh."""
    run_cli("run", *SMALL, "train.max_steps=1", "run.dir=a", cwd=tmp_path)
    two = ["launcher=local", "launcher.nproc=2", "train.max_steps=4", "run.dir=a"]
    proc = run_cli("run", *SMALL, *two, cwd=tmp_path)
    said = (
        "checkpoint written by 1 rank(s), now 2: RNG streams restart from the seed; the rest "
        "of epoch 1 is dealt to 2 rank(s) afresh, past the first 1 batch(es) of each"
    )
    assert (proc.stdout + proc.stderr).count(said) == 1, proc.stdout + proc.stderr
    assert (tmp_path / "a" / "train.log").read_text().count(said) == 1


def test_a_sharded_checkpoint_of_two_ranks_resumes_on_one_and_is_read_whole(
    tmp_path: Path,
) -> None:
    """train.strategy=fsdp on 2 workers: its checkpoint folders (each rank's shard) continue
    inline on one rank (resharded), `expctl eval` reads the newest whole into one process and
    scores what the run reported, and its weights saved whole start a 2-rank fsdp run
    (checkpoint.init; lr 0, so its validation is the source's)."""
    fsdp = [*SMALL, "train.strategy=fsdp", "optim=adamw", "checkpoint.keep=1"]
    two = ["launcher=local", "launcher.nproc=2"]
    run_cli("run", *fsdp, *two, "train.max_epochs=2", "run.dir=a", cwd=tmp_path)
    run = tmp_path / "a"
    (first,) = retention.list_checkpoints(run)
    assert first.name == "step_000000004.dcp", "2 steps an epoch on 2 ranks"
    proc = run_cli("run", *fsdp, "train.max_epochs=3", "run.dir=a", cwd=tmp_path)
    assert f"resumed from {first} (step 4, end of epoch 2)" in proc.stdout, proc.stdout
    log = (run / "train.log").read_text()
    assert "checkpoint written by 2 rank(s), now 1: RNG streams restart" in log
    result = json.loads((run / "result.json").read_text())
    assert result["step"] == 8 and retention.list_checkpoints(run)[0].name.endswith("8.dcp")
    record = expctl.evaluate(run, which="last")
    assert record["val/acc"] == result["val/acc"] == synthetic_accuracy(run)
    assert record["val/loss"] == pytest.approx(result["val/loss"], rel=1e-6)
    torch.save(expctl.load_model(run).state_dict(), tmp_path / "whole.pt")
    init = ["checkpoint.init=whole.pt", "optim.lr=0", "train.max_steps=1", "run.dir=b"]
    run_cli("run", *fsdp, *two, *init, cwd=tmp_path)
    started = json.loads((tmp_path / "b" / "result.json").read_text())
    assert started["val/acc"] == result["val/acc"]
    assert started["val/loss"] == pytest.approx(result["val/loss"], rel=1e-6)
