"""Composition (built-in conf/, -C files, overrides, presets) and validation, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from expctl import compose, config
from expctl.errors import UserError


def cfg_of(file: Path | None = None, *overrides: str) -> config.Config:
    return config.validate(compose.compose(str(file) if file else None, list(overrides)))


def test_embedded_default() -> None:
    cfg = cfg_of()
    assert (cfg.model.name, cfg.data.name, cfg.optim.name, cfg.loss.name) == (
        "cnn",
        "fashion_mnist",
        "sgd",
        "cross_entropy",
    )
    assert cfg.launcher.name == "inline" and cfg.run.name == "cnn-fashion_mnist"
    assert cfg.optim.args == {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}


@pytest.mark.parametrize("suffix", [".yml", ".yaml"])
def test_user_file_with_defaults_list_and_overrides(tmp_path: Path, suffix: str) -> None:
    f = tmp_path / f"exp{suffix}"
    f.write_text(
        "defaults:\n  - model: resnet18\n  - optim: adam\noptim:\n  lr: 0.01\ntrain:\n  max_epochs: 4\n"
    )
    cfg = cfg_of(f, "optim.lr=0.05", "train.precision=bf16")
    assert cfg.model.name == "resnet18" and cfg.model.args == {}
    assert cfg.optim.name == "adam" and cfg.optim.args["lr"] == 0.05
    assert cfg.train.max_epochs == 4 and cfg.train.precision == "bf16"


def test_name_in_body_picks_the_group_file(tmp_path: Path) -> None:
    # `model: {name: resnet18}` must not inherit the default cnn's `width`
    f = tmp_path / "exp.yml"
    f.write_text("model: {name: resnet18, num_classes: 10}\n")
    cfg = cfg_of(f)
    assert cfg.model.name == "resnet18" and cfg.model.args == {"num_classes": 10}


def test_name_without_group_file_starts_from_empty(tmp_path: Path) -> None:
    f = tmp_path / "exp.yml"
    f.write_text("model: {name: vgg11, num_classes: 10}\n")
    assert cfg_of(f).model.args == {"num_classes": 10}


def test_command_line_name_picks_the_group_file() -> None:
    assert cfg_of(None, "model.name=mlp").model.args == {"hidden": [256, 128]}


def test_user_group_files_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "wide.yaml").write_text("name: cnn\nwidth: 64\n")
    f = tmp_path / "exp.yaml"
    f.write_text("defaults:\n  - model: wide\n")
    assert cfg_of(f).model.args["width"] == 64


@pytest.mark.parametrize("preset", compose.group_options("experiment"))
def test_every_preset_composes_and_validates(preset: str) -> None:
    cfg = cfg_of(None, f"experiment={preset}")
    assert cfg.model.name and cfg.data.name


def test_frozen_config_round_trips(tmp_path: Path) -> None:
    cfg = cfg_of(None, "experiment=linear_regression")
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    assert config.load(tmp_path) == cfg


BAD = [
    (["train.max_epochs=0"], "train.max_epochs: 0 is below the minimum 1"),
    (["train.max_epochs=three"], "train.max_epochs: expected int"),
    (["train.precision=fp8"], "train.precision: 'fp8' is not one of"),
    (["model=resnet19"], "Did you mean 'resnet18'"),
    (["optim.lrr=0.1"], "optim.lrr"),
    (["+train.epochs=3"], "Did you mean 'max_epochs'"),
    (["model.name=resnet19"], "Did you mean 'resnet18'"),
    (["data.batch_size=-4"], "data.batch_size: -4 is below the minimum 1"),
    (["launcher.nproc=2"], "launcher=local"),
    (["launcher.partition=debug"], "it belongs to launcher=slurm"),
    (["train.device=gpu"], "Did you mean 'cuda'"),
    (["model=mlp", "model.hidden=64"], "model.hidden: expected a list"),
    (["train.precision=fp16"], "Did you mean '16'"),
    (["launcher=inline", "+launcher.nproc=2"], "needs launcher=local"),
    (["checkpoint.resume=/nope/x.pt"], "no checkpoint at"),
    (["+trian.seed=1"], "Did you mean 'train'"),
    (["data.root=/nonexistent"], "Fashion-MNIST not found in /nonexistent"),
    (["optim=sgd", "optim.momentum=fast"], "optim.momentum: expected float"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD)
def test_bad_values_are_user_errors(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as e:
        cfg_of(None, *overrides)
    assert expected in str(e.value)
    assert e.value.hint, "every user error carries a HINT"
    assert len(str(e.value).splitlines()) <= 2
