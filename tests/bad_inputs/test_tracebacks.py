"""Issue 28: inputs that ended in a traceback although the run (or the command) could go on, or
fail in one line: a model with lazy layers scored by `expctl eval`, a decompression bomb among
images that `on_corrupt=skip` skips, TensorBoard's writer thread on a full disk, a run's
config naming an environment variable the shell lacks (`load_model`)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import conftest
import pytest
from test_corpus import png_header

import expctl
from expctl.errors import UserError

LAZY = '''
from torch import nn
from expctl import register

@register("models")
def lazy_mlp(num_classes: int = 3) -> nn.Module:
    """Its first layer learns its input size at the first forward."""
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, num_classes))
'''


@pytest.mark.slow  # trains 2 steps, then evaluates
def test_eval_and_init_of_a_model_with_lazy_layers(tmp_path: Path) -> None:
    """Its checkpoint holds the layer's weights; the model built to score them has the layer
    not yet made (no shape to compare): they are loaded into it."""
    (tmp_path / "lazy_models.py").write_text(LAZY)
    data = [a for a in conftest.SMALL if not a.startswith("model")]
    small = [*data, "train.device=cpu", "train.max_steps=2", "imports=[lazy_models]"]
    conftest.expctl("run", *small, "model=lazy_mlp", "run.dir=lazy", cwd=tmp_path)
    proc = conftest.expctl("eval", "lazy", cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "expctl: val of step 2" in proc.stdout and "Traceback" not in proc.stderr
    init = ["checkpoint.init=lazy", "run.dir=again"]
    proc = conftest.expctl("run", *small, "model=lazy_mlp", *init, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "checkpoint.init: model weights from" in proc.stdout + proc.stderr


@pytest.mark.slow  # trains an epoch of 13 images
def test_a_decompression_bomb_is_a_corrupt_image_that_skip_skips(tmp_path: Path) -> None:
    root = conftest.image_tree(tmp_path / "images" / "train", classes=2, per_class=4)
    conftest.image_tree(tmp_path / "images" / "val", classes=2, per_class=2)
    (root / "class_0" / "huge.png").write_bytes(png_header(20_000, 20_000))
    args = ["run", "data=image_folder", "data.root=images", "data.image_size=8", "model=mlp"]
    args += ["data.batch_size=4", "train.max_epochs=1", "train.device=cpu", "data.num_workers=0"]
    proc = conftest.expctl(*args, "data.on_corrupt=skip", cwd=tmp_path, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said[-2000:]
    assert "skipped corrupt image" in said and "huge.png" in said, said
    assert "Traceback" not in said
    shutil.rmtree(tmp_path / "runs")
    proc = conftest.expctl(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "huge.png cannot be decoded" in proc.stderr and "decompression bomb" in proc.stderr
    assert not (tmp_path / "runs").exists(), "nothing half-written on disk"


def test_tensorboard_writer_thread_on_a_full_disk_prints_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread's OSError (here: its event file replaced by a folder) is not printed
    by the thread; the training thread's next write raises it, for expctl to report once."""
    from expctl.builtin.loggers import TensorBoard

    printed: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", printed.append)  # what would be printed
    logger = TensorBoard(tmp_path)
    logger.log_metrics({"train/loss": 1.0}, 1)
    logger.writer.flush()
    (events,) = (tmp_path / "tb").glob("events.*")
    events.unlink()
    events.mkdir()  # its next append fails: IsADirectoryError, an OSError
    logger.log_metrics({"train/loss": 0.5}, 2)
    with pytest.raises(OSError):
        for step in range(3, 200):  # until the thread has met it
            logger.log_metrics({"train/loss": 0.5}, step)
            logger.writer.flush()
    assert printed == [], "the writer thread printed its traceback"
    os.rmdir(events)


def test_load_model_names_an_unset_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's `env: {WANDB_API_KEY: ${oc.env:WANDB_API_KEY}}` without the variable."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    (tmp_path / "config.yaml").write_text("env: {WANDB_API_KEY: '${oc.env:WANDB_API_KEY}'}\n")
    with pytest.raises(UserError) as e:
        expctl.load_model(tmp_path)
    assert e.value.message == (
        "env.WANDB_API_KEY: ${oc.env:WANDB_API_KEY} needs the environment variable "
        "WANDB_API_KEY, which is not set"
    )
    assert "export WANDB_API_KEY=" in str(e.value.hint)
