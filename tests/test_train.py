"""Training end to end with real processes: inline, local DDP (gloo), torchrun, resume, restarts."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import conftest
import pytest
import torch
from conftest import cli_env, run_dirs, wait_for, workers_of
from conftest import expctl as run_cli

import expctl
from expctl import registry
from expctl.config import frozen as config
from expctl.dist import check_sync_batchnorm
from expctl.rank import checkpoint, retention

# integration tier: real processes and real training (`pytest -m slow`)
pytestmark = pytest.mark.slow


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    path = retention.list_checkpoints(run_dir)[0]
    return checkpoint.load(path)["models"]["model"]


def history(run_dir: Path) -> list[dict[str, float]]:
    """metrics.jsonl without what the clock decides (time, samples/s)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time", "perf/samples_per_s")} for r in rows]


def test_inline_run_writes_the_run_directory(tiny: Path) -> None:
    proc = run_cli("run", "-C", str(tiny), cwd=tiny.parent)
    (run_dir,) = run_dirs(tiny.parent / "runs")
    assert f"results in {run_dir}" in proc.stdout
    result = json.loads((run_dir / "result.json").read_text())
    assert result["step"] == 2 * (512 // 32) and result["epoch"] == 2
    assert {"val/acc", "val/loss", "train/loss"} <= set(result)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all({"step", "epoch"} <= set(e) for e in events)
    assert [e["step"] for e in events if "val/acc" in e] == [16, 32]
    assert (run_dir / "train.log").is_file() and retention.list_checkpoints(run_dir)
    assert (run_dir / "config.yaml").stat().st_mode & 0o002 == 0, "no world-writable files"


def test_python_api_run_and_load_model(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tiny.parent)
    # the file says sgd (lr 0.1, momentum 0.9) and mlp: the overrides win, without those keys
    result = expctl.run(str(tiny), overrides=["train.max_epochs=1", "model=linear", "optim=adam"])
    assert result["step"] == 16 and result.run_dir.is_dir()
    frozen = config.load(result.run_dir)
    assert frozen.model.name == "linear" and frozen.optim.name == "adam"
    assert frozen.optim.args["lr"] == 0.001 and "momentum" not in frozen.optim.args
    model = expctl.load_model(result.run_dir)
    assert not model.training
    x = torch.randn(3, 20)
    assert model(x).shape == (3, 4)


def test_any_torchvision_model_by_name_trains(tmp_path: Path) -> None:
    """model=resnet50 (no YAML file anywhere): its node, 1-channel stem and classes from the data."""
    run_cli(
        "run",
        "model=resnet50",
        "data=synthetic",
        "data.shape=[1,32,32]",
        "data.num_classes=3",
        "data.num_samples=16",
        "data.val_samples=8",
        "data.batch_size=4",
        "train.max_steps=2",
        "sched=none",
        "run.dir=r50",
        cwd=tmp_path,
    )
    frozen = config.load(tmp_path / "r50")
    assert frozen.model.name == "resnet50" and frozen.model.args["num_classes"] is None
    model = expctl.load_model(tmp_path / "r50")
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 3)


def test_user_module_from_imports(tiny: Path) -> None:
    run_cli(
        "run",
        "-C",
        str(tiny),
        "imports=[faulty]",
        "model.name=tiny_custom",  # a switch: mlp's `hidden` from the file stays behind
        "train.max_epochs=1",
        cwd=tiny.parent,
    )
    (run_dir,) = run_dirs(tiny.parent / "runs")
    assert expctl.load_model(run_dir)[1].out_features == 8


def test_two_runs_in_the_same_second_never_share_a_directory(tiny: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "expctl", "run", "-C", str(tiny), "train.max_epochs=1"],
            cwd=tiny.parent,
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    dirs = run_dirs(tiny.parent / "runs")
    assert len(dirs) == 2 and all((d / "result.json").is_file() for d in dirs)


def test_local_ddp_matches_one_process_with_twice_the_batch(tiny: Path) -> None:
    """2 workers x batch 16 == 1 worker x batch 32 after the same steps (fp32 tolerance)."""
    common = ["-C", str(tiny), "train.max_epochs=1", "data.num_samples=256"]
    run_cli(
        "run",
        *common,
        "data.batch_size=16",
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=ddp",
        cwd=tiny.parent,
    )
    run_cli("run", *common, "data.batch_size=32", "run.dir=single", cwd=tiny.parent)
    a, b = final_weights(tiny.parent / "ddp"), final_weights(tiny.parent / "single")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    ra = json.loads((tiny.parent / "ddp" / "result.json").read_text())
    rb = json.loads((tiny.parent / "single" / "result.json").read_text())
    assert ra["step"] == rb["step"] == 8
    assert ra["val/acc"] == pytest.approx(rb["val/acc"], abs=1e-6)
    assert ra["val/loss"] == pytest.approx(rb["val/loss"], rel=1e-4)


BATCHNORM = """\
model: {name: cnn, width: 8}
data: {name: synthetic, shape: [1, 4, 4], num_classes: 4, num_samples: 128, val_samples: 4096, batch_size: 4}
optim: {name: sgd, lr: 0.1, momentum: 0.9}
sched: {name: null}
train: {max_epochs: 1, log_every: 4}
"""


# fsdp: each of the model's blocks sharded on its own (its weights gathered from every rank at
# each forward), and an odd number of validation samples: rank 1 has a batch fewer than rank 0
FSDP_BLOCKS = [
    "train.strategy=fsdp",
    "imports=[faulty]",
    "model=tiny_blocks",
    "data.val_samples=1025",
]


@pytest.mark.parametrize("strategy", [[], FSDP_BLOCKS])
def test_two_workers_report_the_saved_models_batchnorm_metrics(
    tmp_path: Path, strategy: list[str]
) -> None:
    """With BatchNorm, 2 workers: result.json's validation is the saved model's, to the sample
    (each rank updates its own running statistics after DDP's broadcast; rank 0's are saved).
    The same with the model sharded (a checkpoint folder, read whole by load_model)."""
    (tmp_path / "bn.yml").write_text(BATCHNORM)
    proc = run_cli(
        *["run", "-C", "bn.yml", "launcher=local", "launcher.nproc=2", "run.dir=bn", *strategy],
        cwd=tmp_path,
    )
    assert "deprecated" not in proc.stderr  # DDP's buffer flag by the name this torch takes
    run_dir = tmp_path / "bn"
    cfg = config.load(run_dir)
    val = registry.get("datasets", cfg.data.name).factory(**cfg.data.args).val
    x, y = val.tensors
    with torch.no_grad():
        out = expctl.load_model(run_dir)(x)
    correct = int((out.argmax(1) == y).sum())
    result = json.loads((run_dir / "result.json").read_text())
    assert (round(result["val/acc"] * len(y)), result["val/acc"]) == (correct, correct / len(y))
    loss = float(torch.nn.functional.cross_entropy(out, y))
    assert result["val/loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize(
    "low",
    [
        ["train.precision=bf16", "train.activation_checkpointing=selective", "train.grad_clip=1"],
        ["train.precision=16", "train.activation_checkpointing=full", "train.grad_accum=2"],
    ],
)
def test_a_sharded_model_trains_in_bf16_and_fp16_with_batchnorm(
    tmp_path: Path, low: list[str]
) -> None:
    """FSDP's mixed precision (weights gathered in bf16 / fp16, gradients reduced in fp32; fp16
    with the sharded loss scaler) on a model with BatchNorm, which stays in fp32 as autocast
    keeps it (in bf16 it failed: its statistics are fp32), with activation checkpointing: the
    run completes, and the fp32 weights it saved score what it reported, to that precision."""
    (tmp_path / "bn.yml").write_text(BATCHNORM)
    args = [*FSDP_BLOCKS[:-1], "data.val_samples=64", *low]
    run_cli(
        "run",
        "-C",
        "bn.yml",
        "launcher=local",
        "launcher.nproc=2",
        "run.dir=bn",
        *args,
        cwd=tmp_path,
    )
    run_dir = tmp_path / "bn"
    cfg = config.load(run_dir)
    x, y = registry.get("datasets", cfg.data.name).factory(**cfg.data.args).val.tensors
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(expctl.load_model(run_dir)(x), y))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["val/loss"] == pytest.approx(loss, rel=0.03)


def test_sync_batchnorm_on_cpu_is_a_user_error(tmp_path: Path) -> None:
    """torch's SyncBatchNorm runs only on GPUs: 2 CPU workers are refused before they start
    (the launcher checks; each rank checks again under torchrun or srun), in two lines, exit 2."""
    (tmp_path / "bn.yml").write_text(BATCHNORM)
    proc = run_cli(
        "run",
        "-C",
        "bn.yml",
        "train.sync_batchnorm=true",
        "train.device=cpu",
        "launcher=local",
        "launcher.nproc=2",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "train.sync_batchnorm=true" in proc.stderr and "HINT" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
    with pytest.raises(expctl.UserError, match="SyncBatchNorm runs only on GPUs"):
        check_sync_batchnorm(2, "cpu")
    check_sync_batchnorm(1, "cpu")  # one rank: plain BatchNorm, nothing to sync
    check_sync_batchnorm(2, "cuda")


def test_kill_and_resume_is_bitwise_exact(tiny: Path) -> None:
    """SIGKILL mid-epoch, run again with resume=auto: the same weights and the same history as
    an uninterrupted run (the checkpoint lies between two train rows: the row after it averages
    its whole window; the last steps get a row of their own)."""
    args = [
        "run",
        "-C",
        str(tiny),
        "imports=[faulty]",
        "train.step=kill_at_step",
        "checkpoint.every=5",
        "train.log_every=3",
        "+model.dropout=0.2",
    ]
    run_cli(*args, "run.dir=ref", cwd=tiny.parent)
    killed = run_cli(
        *args, "run.dir=cut", cwd=tiny.parent, env=cli_env(KILL_AT_STEP="23"), check=False
    )
    assert killed.returncode == -9, killed.stderr
    assert retention.list_checkpoints(tiny.parent / "cut")[0].name == "step_000000020.pt"
    resumed = run_cli(*args, "run.dir=cut", cwd=tiny.parent)
    assert "resumed from" in resumed.stdout and "(step 20, epoch 2, batch 4)" in resumed.stdout
    a, b = final_weights(tiny.parent / "ref"), final_weights(tiny.parent / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    ref = history(tiny.parent / "ref")
    assert history(tiny.parent / "cut") == ref
    assert [r["step"] for r in ref if "train/loss" in r][-2:] == [30, 32]


def test_killed_worker_restarts_and_resumes_exactly(tiny: Path) -> None:
    """launcher.max_restarts: rank 1 dies by SIGKILL; all workers restart from the checkpoint."""
    args = [
        "run",
        "-C",
        str(tiny),
        "imports=[faulty]",
        "train.step=kill_at_step",
        "checkpoint.every=3",
        "+model.dropout=0.2",
        "data.batch_size=16",
        "launcher=local",
        "launcher.nproc=2",
        "launcher.max_restarts=1",
        "train.max_epochs=1",
    ]
    run_cli(*args, "run.dir=ref", cwd=tiny.parent)
    proc = run_cli(
        *args, "run.dir=cut", cwd=tiny.parent, env=cli_env(KILL_AT_STEP="11", KILL_RANK="1")
    )
    assert "resumed from" in proc.stdout and "(step 9," in proc.stdout
    a, b = final_weights(tiny.parent / "ref"), final_weights(tiny.parent / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert history(tiny.parent / "cut") == history(tiny.parent / "ref"), "each rank's window"


def test_torchrun_environment_is_detected(tiny: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun
    proc = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "expctl",
            "run",
            "-C",
            str(tiny),
            "train.max_epochs=1",
        ],
        cwd=tiny.parent,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_dirs(tiny.parent / "runs")
    assert "torchrun x 2 rank(s)" in (run_dir / "train.log").read_text()
    assert proc.stdout.count("expctl: done") == 1, "rank 0 alone reports"
    assert json.loads((run_dir / "result.json").read_text())["step"] == 512 // 64


def test_fashion_mnist_two_process_gloo(tmp_path: Path) -> None:
    run_cli(
        "run",
        "launcher=local",
        "launcher.nproc=2",
        "train.max_steps=30",
        "train.log_every=10",
        "run.dir=fm",
        cwd=tmp_path,
    )
    result = json.loads((tmp_path / "fm" / "result.json").read_text())
    assert result["step"] == 30 and result["val/acc"] > 0.6  # 10 classes: chance is 0.1


def test_multirun_runs_each_point(tiny: Path) -> None:
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "optim.lr=0.01,0.1", "train.max_epochs=1", cwd=tiny.parent
    )
    dirs = run_dirs(tiny.parent / "runs")
    assert len(dirs) == 2 and all((d / "result.json").is_file() for d in dirs)
    assert "optim.lr=0.01" in proc.stdout and "optim.lr=0.1" in proc.stdout


SMALL_VAL = ["data.val_split=256"]


@pytest.mark.parametrize(
    "preset", ["default", "fashion_resnet18", "linear_regression", "dcgan", "gpt_tiny"]
)
def test_example_presets_train(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example preset as a user runs it, on its real data, made a smoke test by
    experiment=debug (a few steps, two validation batches; the default preset validates its whole
    split, to compare with expctl eval, which always scores the whole split)."""
    monkeypatch.chdir(tmp_path)
    whole = ["train.limit_val_batches=null"] if preset in ("default", "gpt_tiny") else []
    result = expctl.run(
        None, [f"experiment={preset}", "experiment=debug", "train.max_steps=3", *whole]
    )
    assert result["step"] == 3
    log = (result.run_dir / "train.log").read_text()
    assert ("validation limited to 2 batch(es) per rank" in log) != bool(whole)
    if preset == "dcgan":
        models = expctl.load_model(result.run_dir)
        assert set(models) == {"generator", "discriminator"} and "train/loss_g" in result.metrics
    elif preset == "gpt_tiny":  # its corpus made on first use; the reported loss is the saved's
        assert result["val/ppl"] == pytest.approx(math.exp(result["val/loss"]))
        again = expctl.evaluate(result.run_dir, which="last")
        assert again["val/loss"] == result["val/loss"] and again["val/ppl"] == result["val/ppl"]
    elif preset == "linear_regression":
        assert "val/loss" in result.metrics and "val/acc" not in result.metrics
    else:  # the other presets' eval on 256 held-out samples: ResNet-18 on 10k images took minutes
        again = expctl.evaluate(result.run_dir, which="last", overrides=[] if whole else SMALL_VAL)
        assert again["step"] == 3 and "val/acc" in again
        if whole:  # the score reported is the saved weights' score
            assert again["val/acc"] == result["val/acc"], (again, result.metrics)


def test_grad_accumulation_matches_the_larger_batch(tiny: Path) -> None:
    """2 micro-batches of 16 with no_sync == one batch of 32 (2 workers, so no_sync matters)."""
    common = [
        "-C",
        str(tiny),
        "train.max_epochs=1",
        "data.num_samples=256",
        "launcher=local",
        "launcher.nproc=2",
    ]
    run_cli(
        "run", *common, "data.batch_size=8", "train.grad_accum=2", "run.dir=accum", cwd=tiny.parent
    )
    run_cli("run", *common, "data.batch_size=16", "run.dir=plain", cwd=tiny.parent)
    a, b = final_weights(tiny.parent / "accum"), final_weights(tiny.parent / "plain")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("precision", ["bf16", "16"])
def test_mixed_precision_and_clipping_train(
    precision: str, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tiny.parent)
    result = expctl.run(str(tiny), [f"train.precision={precision}", "train.grad_clip=1.0"])
    assert result["val/acc"] > 0.5  # 4 classes: chance is 0.25
    payload = checkpoint.load(retention.list_checkpoints(result.run_dir)[0])
    assert (payload["scaler"] is not None) == (precision == "16")


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal", "launcher-only"])
def test_ctrl_c_stops_every_worker(tiny: Path, to_group: bool) -> None:
    """SIGINT (Ctrl-C: the terminal's process group; or `kill -INT` of the launcher alone) ends
    the launcher and both workers, no orphans, one line, exit 130; before the first checkpoint
    (none is due), that line says nothing was saved and the same command starts over."""
    import os
    import signal

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "expctl",
            "run",
            "-C",
            str(tiny),
            "imports=[faulty]",
            "train.step=slow",
            "train.max_epochs=50",
            "launcher=local",
            "launcher.nproc=2",
            "checkpoint.every=100000",
            "run.dir=cc",
        ],
        cwd=tiny.parent,
        env=cli_env(SLOW_STEP_S="0.05"),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = tiny.parent / "cc" / "metrics.jsonl"
    wait_for("training", lambda: metrics.is_file() and metrics.read_text())
    assert len(workers_of(tiny.parent / "cc")) == 2
    (os.killpg if to_group else os.kill)(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    # the workers run in sessions of their own (torch's agent): found by their command line
    wait_for("no orphaned worker", lambda: not workers_of(tiny.parent / "cc"), 20)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and out.count("interrupted") == 1, out
    assert "death signal" not in out, out  # torch's agent's "Received 2 death signal ..."
    again = f"run the same command with run.dir={tiny.parent / 'cc'} to start over"
    assert f"expctl: interrupted before its first checkpoint, nothing to resume: {again}" in out, (
        out
    )
    assert not (tiny.parent / "cc" / "checkpoints").exists()


def _as_a_terminal_job(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """`expctl ARGS` in a session of its own, its output piped, getting Ctrl-C as a terminal's
    foreground program does, even when these tests run from a background job (whose SIGINT is
    ignored, and an ignored signal is inherited): a small launcher resets SIGINT, then execs."""
    reset = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    reset += "os.execv(sys.executable, [sys.executable, '-m', 'expctl', *sys.argv[1:]])"
    return subprocess.Popen(
        [sys.executable, "-c", reset, *args],
        cwd=cwd,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_ctrl_c_before_the_first_checkpoint_says_the_same_command_starts_over(tiny: Path) -> None:
    """A run in this process (no launcher) stopped by Ctrl-C before any checkpoint: exit 130,
    one line saying nothing was saved (not "to resume from the last checkpoint"), and the
    command it names starts the run again from step 0."""
    import os
    import signal

    args = ["run", "-C", str(tiny), "imports=[faulty]", "train.step=slow", "run.dir=cc"]
    args += ["checkpoint.every=100000", "train.max_epochs=20"]
    proc = _as_a_terminal_job(args, tiny.parent, cli_env(SLOW_STEP_S="0.05"))
    metrics = tiny.parent / "cc" / "metrics.jsonl"
    wait_for("training", lambda: metrics.is_file() and metrics.read_text())
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in out, out
    again = f"run the same command with run.dir={tiny.parent / 'cc'} to start over"
    assert out.strip().splitlines()[-1] == (
        f"expctl: interrupted before its first checkpoint, nothing to resume: {again}"
    ), out
    assert "to resume from the last checkpoint" not in out, out
    rerun = run_cli(*args, cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0"))
    assert "resumed from" not in rerun.stdout and "320 steps left" in rerun.stdout, rerun.stdout


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_ctrl_c_names_how_to_resume_and_that_resumes(tiny: Path, sweep: bool) -> None:
    """A run without run.dir gets a new directory each launch: the interrupt names the one to
    resume (a sweep: `expctl sweep resume DIR`), and doing so continues from the checkpoint."""
    import os
    import re
    import signal

    args = ["run", "-C", str(tiny), "imports=[faulty]", "train.step=slow", "checkpoint.every=2"]
    args += ["-m", "optim.lr=0.1,0.2"] if sweep else []
    proc = _as_a_terminal_job(args, tiny.parent, cli_env(SLOW_STEP_S="0.1"))
    wait_for("a checkpoint", lambda: list(tiny.parent.glob("runs/**/checkpoints/step_*.pt")))
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in out, out
    how = re.search(r"to resume from the last checkpoint: (.+)", out)
    assert how, out
    if sweep:  # each trial's log is in its own folder
        assert how.group(1).startswith("expctl sweep resume ")
        run_cli("sweep", "resume", how.group(1).split()[-1], cwd=tiny.parent)
        logs = [p.read_text() for p in Path(how.group(1).split()[-1]).glob("trial_*/output.log")]
        assert any("resumed from" in text for text in logs), logs
        return
    else:
        assert how.group(1).startswith("run the same command with run.dir=")
        again = run_cli(
            *args, how.group(1).split()[-1], cwd=tiny.parent, env=cli_env(SLOW_STEP_S="0")
        )
    assert "resumed from" in again.stdout, again.stdout


def test_ddp_skips_the_buffer_broadcast_only_for_batchnorm_statistics() -> None:
    """A training forward never reads BatchNorm's running statistics, so DDP's per-step
    broadcast of them is skipped (the loop syncs them before validating and saving); a model
    with any other buffer keeps DDP's broadcast, since its forward may read it."""
    from torchvision.models import resnet18

    from expctl.rank.strategy import _batchnorm_buffers_only

    class Offset(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)
            self.register_buffer("offset", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(x) + self.offset

    assert _batchnorm_buffers_only(resnet18())
    assert _batchnorm_buffers_only(torch.nn.Linear(3, 2))  # no buffers: nothing to broadcast
    assert _batchnorm_buffers_only(torch.nn.SyncBatchNorm(4))
    assert not _batchnorm_buffers_only(Offset())
    assert not _batchnorm_buffers_only(torch.nn.Sequential(torch.nn.Linear(4, 4), Offset()))


def test_samples_per_s_counts_training_not_validation_or_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every train row's samples/s, the final one's included, leaves out the validations and
    checkpoints inside its window (here each made to last 1 s): the final row was logged after
    the last checkpoint and counted it (ResNet-50 read 0.88x the raw loop so)."""
    from expctl.rank import train  # noqa: PLC0415 - the module whose names are slowed

    def slow(real):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(1.0)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(train, "score_split", slow(train.score_split))
    monkeypatch.setattr(checkpoint, "save", slow(checkpoint.save))
    monkeypatch.chdir(tmp_path)
    per_epoch = 32 // 8
    result = expctl.run(
        None,
        [
            *conftest.SMALL,
            "train.max_steps=10",
            f"train.log_every={per_epoch}",
            "train.val_every=1",
            "checkpoint.every=0",  # at each epoch's end
        ],
    )
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train_rows] == [4, 8, 10]
    for before, row in zip(train_rows, train_rows[1:], strict=False):
        assert row["time"] - before["time"] >= 2.0  # a validation and a checkpoint in between
        training_s = (row["step"] - before["step"]) * 8 / row["perf/samples_per_s"]
        assert training_s < 1.0, (row, training_s)


def test_a_row_restored_with_no_step_since_claims_no_rate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A completed run's checkpoint resumed with the same budget trains no step: its last row
    comes back from the checkpoint without a samples/s (it read 0 before)."""
    monkeypatch.chdir(tmp_path)
    first = expctl.run(None, [*conftest.SMALL, "train.max_steps=6", "train.log_every=4"])
    ckpt = retention.list_checkpoints(first.run_dir)[0]  # the newest: step 6
    again = expctl.run(
        None,
        [*conftest.SMALL, "train.max_steps=6", "train.log_every=4", f"checkpoint.resume={ckpt}"],
    )
    rows = [json.loads(x) for x in (again.run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "train/loss" in r][-1]
    assert last["step"] == 6 and "perf/samples_per_s" not in last
    trained = [json.loads(x) for x in (first.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(r["perf/samples_per_s"] > 0 for r in trained if "train/loss" in r)


def test_a_run_without_a_validation_split_writes_no_empty_validation_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No validation split (data.val=null, val_samples=0): no `val` line, no row of nothing
    but step, epoch and time."""
    monkeypatch.chdir(tmp_path)
    small = [a for a in conftest.SMALL if not a.startswith("data.val_samples")]
    result = expctl.run(None, [*small, "data.val_samples=0", "train.max_epochs=2"])
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(set(r) - {"step", "epoch", "time"} for r in rows), rows
    assert "val epoch" not in (result.run_dir / "train.log").read_text()


def test_batchnorm_given_one_value_per_channel_is_a_settings_error(tmp_path: Path) -> None:
    """BatchNorm in training with one value per channel (a batch of one sample; ResNet-18 at
    32x32 pools to 1x1) ended in torch's ValueError traceback and left the run directory behind,
    which then refused a corrected command: now the setting's error, exit 2, nothing left."""
    proc = run_cli(
        "run", "model=resnet18", "data=synthetic", "data.shape=[3,32,32]", "data.num_classes=3",
        "data.num_samples=8", "data.val_samples=4", "data.batch_size=1", "train.max_steps=1",
        "train.device=cpu", "run.dir=r", cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "expctl: error: data.batch_size=1: a BatchNorm layer" in proc.stderr
    assert "HINT: raise data.batch_size to 2 or more" in proc.stderr
    assert not (tmp_path / "r").exists(), "nothing was saved: nothing is left"
