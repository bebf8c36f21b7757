"""Composition (schema, built-in conf/, presets, -C files, overrides) and validation, in-process."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY, cli_env
from conftest import expctl as run_cli
from omegaconf import MISSING, OmegaConf

from expctl import registry
from expctl.config import compose, confstore, frozen, layers, yamlfile
from expctl.config import schema as config
from expctl.errors import UserError


def cfg_of(file: Path | None = None, *overrides: str, check: bool = True) -> config.Config:
    return compose.compose(str(file) if file else None, list(overrides), check_components=check)


def write(tmp_path: Path, text: str, name: str = "exp.yml") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


def test_embedded_default() -> None:
    cfg = cfg_of()
    assert (cfg.model.name, cfg.data.name, cfg.optim.name, cfg.loss.name, cfg.sched.name) == (
        "cnn",
        "fashion_mnist",
        "sgd",
        "cross_entropy",
        "cosine",
    )
    assert cfg.launcher.name == "inline" and cfg.run.name == "cnn-fashion_mnist"
    assert cfg.optim.args["lr"] == 0.05 and cfg.optim.args["momentum"] == 0.9
    assert cfg.optim.args["nesterov"] is False  # torch's own default, written down
    assert cfg.sched.interval == "step" and cfg.train.max_epochs == 3
    assert cfg_of(None, "train.max_steps=400").train.max_epochs is None, "steps alone decide"


# ---------------------------------------------------------------------------------------------
# precedence: built-in < -C file (defaults list or body) < command line, for every form
# ---------------------------------------------------------------------------------------------

FILE_FORMS = {
    "defaults list": "defaults:\n  - {group}: {old}\n{group}:\n  {key}: {value}\n",
    "body name": "{group}:\n  name: {old}\n  {key}: {value}\n",
    "override in defaults": "defaults:\n  - override /{group}: {old}\n{group}:\n  {key}: {value}\n",
}
CLI_FORMS = ["{group}={new}", "{group}.name={new}", "++{group}.name={new}", "+{group}={new}"]
SWITCHES = [
    # group, the file's choice and one of its own keys, the command line's choice
    ("optim", "sgd", "momentum", "0.5", "adam"),
    ("model", "mlp", "hidden", "[32]", "cnn"),
    ("launcher", "local", "nproc", "2", "inline"),
    ("sched", "multisteplr", "milestones", "[1]", "cosine"),
    ("loss", "cross_entropy", "label_smoothing", "0.1", "mse"),
    ("data", "synthetic", "shape", "[3, 8, 8]", "fashion_mnist"),
]


@pytest.mark.parametrize("form", FILE_FORMS)
@pytest.mark.parametrize("cli", CLI_FORMS)
@pytest.mark.parametrize(("group", "old", "key", "value", "new"), SWITCHES)
def test_command_line_choice_beats_the_file(
    tmp_path: Path, form: str, cli: str, group: str, old: str, key: str, value: str, new: str
) -> None:
    f = write(tmp_path, FILE_FORMS[form].format(group=group, old=old, key=key, value=value))
    assert getattr(cfg_of(f), group).name == old  # the file alone picks its component ...
    notes: list[str] = []
    cfg = compose.compose(str(f), [cli.format(group=group, new=new)], notes=notes)
    chosen = cfg.to_dict()[group]
    assert chosen["name"] == new  # ... the command line wins ...
    assert key not in chosen or chosen[key] != OmegaConf.create({"v": value})["v"]  # ... alone
    assert any(f"{group}={new} sets aside {group} '{old}'" in n for n in notes), notes


def test_same_choice_on_the_command_line_keeps_the_files_settings(tmp_path: Path) -> None:
    f = write(tmp_path, "optim: {name: sgd, lr: 0.3}\n")
    assert cfg_of(f, "optim=sgd").optim.args["lr"] == 0.3
    assert cfg_of(f, "optim.name=sgd", "optim.lr=0.2").optim.args["lr"] == 0.2


def test_settings_follow_their_component(tmp_path: Path) -> None:
    """The last choice wins and means the same whatever was picked before it."""
    alone = cfg_of(None, "optim=sgd").optim.args
    assert alone["lr"] == 0.05 and alone["momentum"] == 0.9  # conf/config.yaml's sgd
    assert cfg_of(None, "optim=adam", "optim=sgd").optim.args == alone
    f = write(tmp_path, "optim: {name: adam, lr: 0.01}\n")
    assert cfg_of(f, "optim=sgd").optim.args == alone  # the file's adam settings stay with adam
    assert cfg_of(f, "optim=sgd", "optim=adam").optim.args["lr"] == 0.01


def test_a_group_file_next_to_the_config_beats_the_builtin_settings(tmp_path: Path) -> None:
    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "sgd.yaml").write_text("name: sgd\nlr: 0.3\nmomentum: 0.5\n")
    (tmp_path / "optim" / "fast.yaml").write_text("name: sgd\nlr: 0.7\n")
    args = cfg_of(write(tmp_path, "defaults: [{optim: sgd}]\n")).optim.args
    assert (args["lr"], args["momentum"]) == (0.3, 0.5)
    args = cfg_of(write(tmp_path, "optim: {name: fast, momentum: 0.1}\n")).optim.args
    assert (args["lr"], args["momentum"]) == (0.7, 0.1)
    assert cfg_of(write(tmp_path, "{}\n"), "optim=fast").optim.args["lr"] == 0.7


def test_writing_the_config_never_changes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXPCTL_TEST_TOKEN", "tok123")
    cfg = cfg_of(
        None,
        "launcher=slurm",
        "env.KEY=${oc.env:EXPCTL_TEST_TOKEN}",
        "launcher.sbatch.comment=${oc.env:EXPCTL_TEST_TOKEN}",
        "launcher.setup=[echo,${oc.env:EXPCTL_TEST_TOKEN}]",
    )
    text = frozen.to_yaml(cfg)
    assert "tok123" not in text and text.count("${oc.env:EXPCTL_TEST_TOKEN}") == 3
    assert cfg.env["KEY"] == "tok123" and cfg.launcher.sbatch["comment"] == "tok123"
    assert cfg.launcher.setup == ["echo", "tok123"]


def test_command_line_keys_beat_the_file_and_presets(tmp_path: Path) -> None:
    f = write(tmp_path, "defaults: [{experiment: fashion_speedrun}]\ntrain: {max_epochs: 4}\n")
    cfg = cfg_of(f)
    assert cfg.model.name == "speednet" and cfg.train.max_epochs == 4  # file beats its preset
    assert cfg_of(f, "train.max_epochs=7").train.max_epochs == 7
    # an experiment picked on the command line beats the file (lightning-hydra-template's rule)
    assert cfg_of(f, "experiment=fashion_resnet18").model.name == "resnet18"


def test_switching_component_never_carries_arguments(tmp_path: Path) -> None:
    f = write(tmp_path, "model: {name: mlp, hidden: [32]}\n")
    assert cfg_of(f, "model=cnn").model.args["width"] == 32
    assert cfg_of(f, "model.name=cnn").model.args["width"] == 32
    assert "width" not in cfg_of(None, "model.name=resnet50").model.args  # cnn's width stays
    with pytest.raises(UserError, match="not a key of model=resnet18"):
        cfg_of(None, "model=resnet18", "model.width=3")  # set by the user: an error


def test_user_group_files_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "wide.yaml").write_text("name: cnn\nwidth: 64\n")
    f = write(tmp_path, "defaults:\n  - model: wide\n")
    cfg = cfg_of(f)
    assert cfg.model.args["width"] == 64 and cfg.model.args["dropout"] == 0.0  # filled in
    assert cfg_of(f, "model.width=8").model.args["width"] == 8


@pytest.mark.parametrize("preset", layers.yaml_options("experiment"))
def test_every_preset_composes_and_validates(preset: str) -> None:
    cfg = cfg_of(None, f"experiment={preset}")
    assert cfg.model.name and cfg.data.name


# ---------------------------------------------------------------------------------------------
# every registered name is a group option holding its signature defaults
# ---------------------------------------------------------------------------------------------


def _all_names() -> list[tuple[str, str]]:
    out = [("launcher", n) for n in config.LAUNCHERS] + [("sched", "none")]
    for section, kind in config.COMPONENT_KINDS.items():
        out += [(section, n) for n in registry.names(kind)]
    return out


@pytest.mark.parametrize(("group", "name"), _all_names())
def test_every_registered_name_is_a_group_option(group: str, name: str) -> None:
    cfg = cfg_of(None, f"{group}={name}", check=False)
    got = cfg.to_dict()[group]
    assert got["name"] == (None if name == "none" else name)
    if group == "launcher":
        fields = dataclasses.fields(config.LAUNCHERS[name])
        assert set(got) == {f.name for f in fields}
        return
    if name == "none":
        return
    entry = registry.get(config.COMPONENT_KINDS[group], name)
    node = confstore.node_defaults(group, entry)
    builtin = layers.read_layer(
        yamlfile.read_yaml(layers.builtin_conf_dir() / "config.yaml", ""), "", []
    )
    tuned = builtin.sections.get(group, {}) if builtin.choices[group] == name else {}
    for p in entry.parameters().values():
        if p.name in tuned:
            assert got[p.name] == tuned[p.name]  # the embedded default's own setting
            continue
        if p.name not in node:
            assert not confstore.settable(p), f"{group}.{p.name} missing"
            continue
        if entry.defers(p.name):
            assert got[p.name] is None
        elif p.default is p.empty:
            assert got[p.name] == MISSING
        else:
            want = list(p.default) if isinstance(p.default, tuple) else p.default
            assert got[p.name] == want or (
                isinstance(want, float) and math.isnan(want) and math.isnan(got[p.name])
            )


def test_required_arguments_are_named_at_show_time() -> None:
    with pytest.raises(UserError, match="'multisteplr' needs argument 'milestones'"):
        cfg_of(None, "sched=multisteplr")
    assert cfg_of(None, "sched=multisteplr", "sched.milestones=[2,4]").sched.args["milestones"]


def test_scheduler_interval_defaults_per_scheduler() -> None:
    assert cfg_of(None, "sched=warmup_cosine").sched.interval == "step"
    assert cfg_of(None, "sched=steplr", "sched.step_size=2").sched.interval == "epoch"
    assert cfg_of(None, "sched=none").sched.name is None


# ---------------------------------------------------------------------------------------------
# one source of defaults
# ---------------------------------------------------------------------------------------------


def _default_of(group: str, choice: str, key: str) -> Any:
    if group == "launcher":
        f = {f.name: f for f in dataclasses.fields(config.LAUNCHERS[choice])}.get(key)
        return f.default if f else MISSING
    entry = registry.get(config.COMPONENT_KINDS[group], choice)
    return confstore.node_defaults(group, entry).get(key, MISSING)


def _conf_files() -> list[Path]:
    conf = layers.builtin_conf_dir()
    return [conf / "config.yaml", *sorted((conf / "experiment").glob("*.yaml"))]


@pytest.mark.parametrize("path", _conf_files(), ids=lambda p: p.name)
def test_conf_states_no_default(path: Path) -> None:
    """conf/ holds choices and what differs: no value equal to the schema's or the chosen
    component's default (the two cannot drift apart)."""
    layer = layers.read_layer(yamlfile.read_yaml(path, path.name), path.name, [])
    base = layers.read_layer(yamlfile.read_yaml(_conf_files()[0], "config.yaml"), "", [])
    restated = []
    for group, section in layer.sections.items():
        choice = layer.choices.get(group, base.choices[group])
        restated += [
            f"{group}.{k}" for k, v in section.items() if v == _default_of(group, choice, k)
        ]
    for name, section in layer.body.items():
        fields = {f.name: f for f in dataclasses.fields(config.FIXED.get(name, object))}
        restated += [
            f"{name}.{k}"
            for k, v in (section or {}).items()
            if k in fields
            and fields[k].default is not dataclasses.MISSING
            and v == fields[k].default
        ]
    assert not restated, f"{path.name} restates defaults: {restated}"


def test_no_yaml_duplicates_a_registered_name() -> None:
    for section, kind in config.COMPONENT_KINDS.items():
        assert not set(layers.yaml_options(section)) & set(registry.names(kind))


# ---------------------------------------------------------------------------------------------
# keys and values
# ---------------------------------------------------------------------------------------------


def test_every_key_show_prints_can_be_overridden_without_plus() -> None:
    cfg = cfg_of(None, "launcher=slurm", check=False)
    values = {"data.val_batch_size": "64", "data.device_resident": "false"}
    overrides = []
    for section in ("train", "checkpoint", "run", "launcher", "sweep", "data", "optim"):
        for key, value in cfg.to_dict()[section].items():
            if key in ("name", "dir") or isinstance(value, (dict, list)):
                continue
            text = values.get(f"{section}.{key}", "null" if value is None else str(value))
            overrides.append(f"{section}.{key}={text}")
    assert len(overrides) > 60
    # one composition of them all: a key that needed a '+' would fail it, naming that key
    cfg_of(None, "launcher=slurm", *overrides, check=False)
    cfg = cfg_of(None, "launcher=slurm", "launcher.sbatch.mail-type=END", "env.A_B=1")
    assert cfg.launcher.sbatch == {"mail-type": "END"} and cfg.env == {"A_B": "1"}
    assert cfg_of(None, "data.device_resident=false").data.device_resident is False


def test_sweep_shorthand_picks_the_sampler(tmp_path: Path) -> None:
    f = write(tmp_path, "sweep: {sampler: tpe, params: {optim.lr: 'interval(0.01, 0.1)'}}\n")
    cfg = cfg_of(f, "sweep=random")
    assert cfg.sweep.sampler == "random" and cfg.sweep.params  # the search space stays


def test_frozen_config_round_trips(tmp_path: Path) -> None:
    cfg = cfg_of(None, "experiment=linear_regression")
    (tmp_path / "config.yaml").write_text(frozen.to_yaml(cfg))
    loaded = frozen.load(tmp_path)
    assert loaded.replace("run", dir=None) == cfg
    assert loaded.run.dir == str(tmp_path.absolute())  # where the file lies, not what it says


def test_secrets_stay_unresolved_in_what_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXPCTL_TEST_TOKEN", "s3cr3t-value")
    f = write(tmp_path, "env:\n  WANDB_API_KEY: ${oc.env:EXPCTL_TEST_TOKEN}\n")
    cfg = cfg_of(f)
    assert cfg.env["WANDB_API_KEY"] == "s3cr3t-value"  # what the workers use
    text = frozen.to_yaml(cfg)
    assert "s3cr3t" not in text and "${oc.env:EXPCTL_TEST_TOKEN}" in text
    cfg2 = cfg_of(None, "env.TOKEN=${oc.env:EXPCTL_TEST_TOKEN}")
    assert "s3cr3t" not in frozen.to_yaml(cfg2)
    (tmp_path / "config.yaml").write_text(text)
    monkeypatch.setenv("EXPCTL_TEST_TOKEN", "rotated")
    assert frozen.load(tmp_path).env["WANDB_API_KEY"] == "rotated"  # resolved where it runs


REACHES_THE_ENVIRONMENT = [  # every way a key's value can come from ${oc.env:...}
    "${oc.select:env.TOKEN,x}",
    "${env.TOKEN}",
    "Bearer ${env.TOKEN}",
    "${.TOKEN}",
    "${oc.select:.TOKEN}",
    "${oc.decode:'${oc.env:EXPCTL_TEST_TOKEN}'}",
    "${oc.env:EXPCTL_TEST_UNSET,${env.TOKEN}}",
]


@pytest.mark.parametrize("text", REACHES_THE_ENVIRONMENT)
def test_a_value_that_reaches_the_environment_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("EXPCTL_TEST_TOKEN", "s3cr3t-value")
    monkeypatch.delenv("EXPCTL_TEST_UNSET", raising=False)
    body = f"env:\n  TOKEN: ${{oc.env:EXPCTL_TEST_TOKEN}}\n  OTHER: {text!r}\n  PLAIN: '${{.X}}'\n"
    cfg = cfg_of(
        write(tmp_path, body + "  X: x\nlauncher: {name: slurm, setup: '${oc.dict.values:env}'}\n")
    )
    assert "s3cr3t-value" in cfg.env["OTHER"] and "s3cr3t-value" in cfg.launcher.setup
    written = frozen.to_yaml(cfg)
    assert "s3cr3t" not in written, written
    assert "PLAIN: x" in written, "a value from elsewhere in the config is written resolved"
    (tmp_path / "config.yaml").write_text(written)
    monkeypatch.setenv("EXPCTL_TEST_TOKEN", "rotated")
    assert "rotated" in frozen.load(tmp_path).env["OTHER"]  # resolved where it runs


@pytest.mark.slow
def test_no_file_a_sweep_writes_holds_an_environment_value(tmp_path: Path) -> None:
    """A sweep's trials (run directories, with loggers) and its best.yml: no file written (nor
    its name) holds the value of a variable read through ${oc.env:...}, however it is reached."""
    value = "s3cr3t-" + os.urandom(6).hex()
    env = cli_env(EXPCTL_TEST_S=value)
    keys = "".join(f"  K{i}: {t!r}\n" for i, t in enumerate(REACHES_THE_ENVIRONMENT))
    body = "env:\n  TOKEN: ${oc.env:EXPCTL_TEST_S}\n" + keys.replace("_TOKEN", "_S")
    (tmp_path / "my.yml").write_text(TINY + body)
    args = ["-m", "optim.lr=0.01,0.1", "logger=[csv,tensorboard]", "train.max_steps=2"]
    proc = run_cli("run", "-C", "my.yml", *args, "data.num_samples=64", cwd=tmp_path, env=env)
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    frozen = (sweep / "trial_000" / "config.yaml").read_text()
    assert "K0: ${oc.select:env.TOKEN,x}" in frozen and "TOKEN: ${oc.env:EXPCTL_TEST_S}" in frozen
    shown = run_cli("show", "-C", str(sweep / "best.yml"), cwd=tmp_path, env=env).stdout
    assert "K0: ${oc.select:env.TOKEN,x}" in shown and value not in shown
    files = [p.relative_to(sweep) for p in sweep.rglob("*") if p.is_file()]
    assert {Path("best.yml"), Path("trial_001/metrics.csv")} <= set(files)
    assert any(p.name.startswith("events.out.tfevents") for p in files)
    for path in tmp_path.rglob("*"):
        assert value not in str(path), path
        if path.is_file():
            assert value.encode() not in path.read_bytes(), path


BAD = [
    (["train.max_epochs=0"], "train.max_epochs: 0 is below the minimum 1"),
    (["train.max_epochs=three"], "train.max_epochs: expected int, got 'three'"),
    (["train.precision=fp8"], "train.precision: 'fp8' is not one of"),
    (["model=resnet19"], "Did you mean 'resnet18'"),
    (["optim.lrr=0.1"], "Did you mean 'lr'"),
    (["+train.epochs=3"], "Did you mean 'max_epochs'"),
    (["model.name=resnet19"], "Did you mean 'resnet18'"),
    (["data.batch_size=-4"], "data.batch_size: -4 is below the minimum 1"),
    (["data.val_batch_size=0"], "data.val_batch_size: 0 is below the minimum 1"),
    (["launcher.nproc=2"], "launcher=local"),
    (["launcher.partition=debug"], "launcher=slurm has it"),
    (["train.device=gpu"], "Did you mean 'cuda'"),
    (["model=mlp", "model.hidden=64"], "model.hidden: expected a list"),
    (["train.precision=fp16"], "Did you mean '16'"),
    (["launcher=inline", "+launcher.nproc=2"], "launcher=local"),
    (["checkpoint.resume=/nope/x.pt"], "no checkpoint at"),
    (["+trian.seed=1"], "Did you mean 'train'"),
    (["trian.max_epochs=1"], "Did you mean 'train.max_epochs'"),
    (["precision=bf16"], "Did you mean 'train.precision'"),
    (["max_epochs=2"], "Did you mean 'train.max_epochs'"),
    (["data.root=/nonexistent"], "data=fashion_mnist: not found under /nonexistent"),
    (["optim=sgd", "optim.momentum=fast"], "optim.momentum: expected float"),
    (["optim.lr=nan"], "optim.lr=nan: not a finite number"),
    (["launcher.rdzv_timeout=inf"], "launcher.rdzv_timeout=inf: not a finite number"),
    (["launcher=slurm", "launcher.mem_gb=nan"], "launcher.mem_gb=nan: not a finite number"),
    (["hydra.run.dir=/tmp/x"], "use run.dir=PATH"),
    (["hydra.sweep.dir=/tmp/x"], "use run.root=PATH"),
    (["hydra/launcher=joblib"], "hydra.* settings have no effect"),
    (["~optim"], "deleting is not supported"),
    (["experiment=nope"], "no 'nope' in config group 'experiment'"),
    (["launcher=nowhere"], "no 'nowhere' in config group 'launcher'"),
    (["sched=cosinee"], "Did you mean 'cosine'"),
    (["optim=SGD"], "Did you mean 'sgd'"),
    (["~optim.lr"], "deleting is not supported"),
    (["sweep.trial=3"], "unknown config key 'sweep.trial'"),
    (["optim=lbfgs"], "needs a closure"),
    (["train.channels_last=maybe"], "not one of: auto, true, false"),
]


@pytest.mark.parametrize(("overrides", "expected"), BAD)
def test_bad_values_are_user_errors(overrides: list[str], expected: str) -> None:
    with pytest.raises(UserError) as e:
        cfg_of(None, *overrides)
    assert expected in str(e.value)
    assert e.value.hint, "every user error carries a HINT"
    assert len(str(e.value).splitlines()) <= 2


BAD_FILES = [
    ("train: {epochs: 3}\n", "Did you mean 'max_epochs'"),
    ("trian: {max_epochs: 3}\n", "Did you mean 'train'"),
    ("optim: {name: sgd, momentm: 0.9}\n", "Did you mean 'momentum'"),
    ("defaults: [{model: resnt18}]\n", "Did you mean 'resnet18'"),
    ("defaults: [{optim: adam}]\noptim: {name: sgd}\n", "name the optim once"),
    ("hydra: {run: {dir: /tmp/x}}\n", "a hydra: section has no effect"),
    ("hydra: {searchpath: [file:///tmp]}\n", "a hydra: section has no effect"),
    ("precision: bf16\n", "Did you mean 'train.precision'"),
    ("defaults: [base]\n", "not one of expctl's groups"),
    ("train: {max_epochs: three}\n", "train.max_epochs: expected int"),
    ("model: 3\n", "model must be a mapping or a name"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_FILES)
def test_bad_files_are_user_errors(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(UserError) as e:
        cfg_of(write(tmp_path, text))
    assert expected in str(e.value)
    assert len(str(e.value).splitlines()) <= 2


def test_a_multi_line_secret_from_the_environment_reaches_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PEM key through ${oc.env:...}: newlines are fine in an environment variable (a NUL,
    which none can hold, is a case of the bad-input corpus)."""
    monkeypatch.setenv("EXPCTL_TEST_SECRET", "-----BEGIN KEY-----\nabc\n-----END KEY-----")
    cfg = compose.compose(None, ["env.T=${oc.env:EXPCTL_TEST_SECRET}"], check_components=False)
    assert cfg.env["T"].count("\n") == 2


@pytest.mark.slow
def test_relative_file_paths_are_frozen_absolute(tmp_path: Path) -> None:
    """From a user trial: `data.root=imgs` frozen as written named other files once the run was
    evaluated or continued from another directory."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "best.pt").write_bytes(b"")
    (tmp_path / "t.csv").write_text("a,y\n1,0\n2,1\n")
    out = run_cli(
        "show", "data=arrays", "data.train=t.csv", "checkpoint.init=w/best.pt", cwd=tmp_path
    ).stdout
    assert f"train: {tmp_path / 't.csv'}" in out and f"init: {tmp_path / 'w' / 'best.pt'}" in out
    for split in ("train", "val"):
        (tmp_path / "imgs" / split / "cat").mkdir(parents=True)
    out = run_cli("show", "data.root=imgs", "data.name=image_folder", cwd=tmp_path).stdout
    assert f"root: {tmp_path / 'imgs'}" in out and "train: train" in out  # a sub-folder's name
    uri = "logger.mlflow.tracking_uri=sqlite:///m.db"
    out = run_cli("show", "logger=[mlflow]", uri, cwd=tmp_path).stdout
    assert f"tracking_uri: sqlite:///{tmp_path / 'm.db'}" in out
