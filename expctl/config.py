"""The config schema: validate a composed dict into a frozen Config, and save/load it.

Fixed sections (train, checkpoint, run, launcher) are dataclasses checked key by key.
Component sections (model, data, optim, sched, loss) hold a registered ``name``, a few framework
keys, and the factory's own arguments, checked against its signature (registry.check_args).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl.errors import UserError, choices_text, did_you_mean


def _f(default: Any, *, choices: tuple[Any, ...] = (), min: float | None = None) -> Any:
    meta: dict[str, Any] = {}
    if choices:
        meta["choices"] = choices
    if min is not None:
        meta["min"] = min
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """How the loop runs."""

    max_epochs: int = _f(1, min=1)
    max_steps: int | None = _f(None, min=1)
    precision: str = _f("auto", choices=("auto", "32", "bf16", "16"))
    grad_accum: int = _f(1, min=1)
    grad_clip: float | None = _f(None, min=0)
    seed: int = 0
    log_every: int = _f(50, min=1)
    val_every: int = _f(1, min=1)
    step: str = "supervised"
    device: str = _f("auto", choices=("auto", "cpu", "cuda"))
    channels_last: str | bool = _f("auto", choices=("auto", True, False))
    compile: bool = False
    on_nan: str = _f("stop", choices=("stop", "skip"))


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written, how many are kept, and where training resumes from."""

    every: int = _f(0, min=0)
    keep: int = _f(2, min=1)
    resume: str = "auto"


@dataclass(frozen=True)
class RunConfig:
    """Where the run directory goes."""

    root: str = "runs"
    name: str = "run"
    dir: str | None = None


@dataclass(frozen=True)
class LauncherConfig:
    """How processes are started: inline, local (elastic agent) or slurm (submitit)."""

    name: str = _f("inline", choices=("inline", "local", "slurm"))
    nproc: int = _f(1, min=1)
    max_restarts: int = _f(0, min=0)
    rdzv_timeout: float = _f(120.0, min=1)
    collective_timeout: float = _f(1800.0, min=1)
    # preemption and time limits (Slurm): the signal that asks for checkpoint + requeue
    signal: str = _f("USR2", choices=("USR1", "USR2", "TERM", "INT", "HUP", "URG"))
    signal_delay_s: int = _f(90, min=0)
    max_requeues: int = _f(3, min=0)
    # launcher=slurm (submitit); see conf/launcher/slurm.yaml
    nodes: int = _f(1, min=1)
    tasks_per_node: int | None = _f(None, min=1)
    gpus_per_node: int = _f(0, min=0)
    cpus_per_task: int | None = _f(None, min=1)
    mem_gb: float | None = _f(None, min=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    timeout_min: int = _f(60, min=1)
    job_name: str | None = None
    sbatch: dict[str, Any] = _f({})
    setup: list[str] = _f([])


@dataclass(frozen=True)
class SweepConfig:
    """How `-m` explores: sampler, objective, early stopping of bad trials (conf/sweep/)."""

    sampler: str = _f("grid", choices=("grid", "random", "tpe"))
    n_trials: int | None = _f(None, min=1)
    metric: str = "val/acc"
    mode: str = _f("max", choices=("max", "min"))
    pruner: str = _f("none", choices=("none", "asha", "median"))
    budget: str = _f("epoch", choices=("epoch", "step"))  # the unit trials report progress in
    grace: int = _f(1, min=1)  # ASHA: budget every trial gets; median: warm-up before pruning
    reduction: int = _f(3, min=2)  # ASHA: keep the top 1/reduction at each rung
    repeat: int = _f(1, min=1)  # seeds per configuration
    seed: int = 0  # the sampler's seed
    stop_on_failure: bool = False
    params: dict[str, str] = _f(
        {}
    )  # search space in YAML: {optim.lr: "tag(log, interval(1e-4, 1e-1))"}
    # set by expctl in each trial's frozen config
    storage: str | None = None
    trial: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """A registered model (or a dict of models) and its constructor arguments."""

    name: str
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class DataConfig:
    """A registered dataset, its arguments, and how it is batched."""

    name: str
    batch_size: int = _f(128, min=1)
    val_batch_size: int | None = _f(None, min=1)
    num_workers: int = _f(0, min=0)
    device_resident: str | bool = _f("auto", choices=("auto", True, False))
    augment: str = _f("none", choices=("none", "flip", "crop_flip"))  # on the device, per batch
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class OptimConfig:
    """A registered optimizer and its arguments (applied to each model)."""

    name: str
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class SchedConfig:
    """An optional LR scheduler, stepped every optimizer `step` or every `epoch`."""

    name: str | None = None
    interval: str = _f("epoch", choices=("epoch", "step"))
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class LossConfig:
    """A registered loss and its arguments."""

    name: str
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class Config:
    """The whole frozen config, as every rank reads it from RUN_DIR/config.yaml."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    loss: LossConfig
    sched: SchedConfig = _f(SchedConfig())
    train: TrainConfig = _f(TrainConfig())
    checkpoint: CheckpointConfig = _f(CheckpointConfig())
    launcher: LauncherConfig = _f(LauncherConfig())
    run: RunConfig = _f(RunConfig())
    sweep: SweepConfig = _f(SweepConfig())
    imports: list[str] = _f([])
    env: dict[str, str] = _f({})

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict, component arguments folded back next to ``name``."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                d = {k.name: getattr(value, k.name) for k in dataclasses.fields(value)}
                d.update(d.pop("args", {}) or {})
                out[f.name] = d
            else:
                out[f.name] = value
        return out

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with `changes` applied to one section."""
        return dataclasses.replace(
            self, **{section: dataclasses.replace(getattr(self, section), **changes)}
        )


_COMPONENT_KINDS = {
    "model": "models",
    "data": "datasets",
    "optim": "optimizers",
    "sched": "schedulers",
    "loss": "losses",
}
IGNORED_TOP = ("hydra",)


def validate(raw: dict[str, Any], check_components: bool = True) -> Config:
    """Check a composed, resolved dict and build the frozen Config.

    Args:
        raw: the output of compose (or a loaded config.yaml).
        check_components: also check names and arguments against the registries (imports
            `imports:` modules and the built-ins, which imports torch).

    Raises:
        UserError: unknown keys (with did-you-mean), wrong types, out-of-range values.
    """
    if not isinstance(raw, dict):
        raise UserError("the config must be a mapping of sections")
    known = {f.name for f in dataclasses.fields(Config)}
    for key in raw:
        if key not in known and key not in IGNORED_TOP:
            raise UserError(
                f"unknown config section '{key}'.{did_you_mean(key, known)} Valid: {choices_text(known)}",
                "remove it, or fix its spelling",
            )
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Config):
        if f.name not in raw:
            if f.name in ("model", "data", "optim", "loss"):
                raise UserError(f"the config has no '{f.name}' section", f"add {f.name}.name=...")
            continue
        hint = typing.get_type_hints(Config)[f.name]
        values[f.name] = _coerce(f.name, raw[f.name], hint)
    cfg = Config(**values)
    _cross_checks(cfg)
    if check_components:
        check_registered(cfg)
    return cfg


def check_registered(cfg: Config) -> None:
    """Check every component name and argument against the registries."""
    from expctl import registry

    registry.import_user_modules(cfg.imports)
    for section, kind in _COMPONENT_KINDS.items():
        comp = getattr(cfg, section)
        if comp.name is None:
            continue
        registry.check_args(kind, comp.name, comp.args, section)
    registry.get("steps", cfg.train.step)


_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.+=-]+$")


def _cross_checks(cfg: Config) -> None:
    t, ln = cfg.train, cfg.launcher
    if not _NAME_CHARS.match(cfg.run.name) or cfg.run.name.startswith(".") or ".." in cfg.run.name:
        raise UserError(
            f"run.name={cfg.run.name!r}: a run name becomes a folder name and may only hold "
            "letters, digits and _ . + = - (no '/', '..', spaces, quotes or shell characters)",
            "pick a plain name, e.g. run.name=resnet18-lr0.1; use run.root / run.dir for the place",
        )
    if ln.name == "inline" and ln.nproc > 1:
        raise UserError(
            f"launcher.nproc={ln.nproc} needs launcher=local (inline runs in this one process)",
            f"use launcher=local launcher.nproc={ln.nproc}",
        )
    for key in cfg.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise UserError(
                f"env.{key}: not an environment variable name", "use letters, digits and _"
            )
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).expanduser().exists():
        raise UserError(
            f"checkpoint.resume: no checkpoint at '{resume}'",
            "use auto (latest in the run directory), never, or the path of a .pt checkpoint",
        )
    if t.grad_accum > 1 and t.step != "supervised":
        raise UserError(
            f"train.grad_accum={t.grad_accum} is handled by the supervised step only "
            f"(train.step={t.step})",
            "set train.grad_accum=1, or accumulate inside your own step",
        )


def _coerce(where: str, value: Any, hint: Any) -> Any:
    """Check `value` against the type `hint` (dataclasses recursively) and return it."""
    if dataclasses.is_dataclass(hint):
        return _section(where, value, hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        opts = typing.get_args(hint)
        if value is None and type(None) in opts:
            return None
        for opt in opts:
            if opt is not type(None):
                try:
                    return _coerce(where, value, opt)
                except UserError:
                    continue
        names = " or ".join(_tname(o) for o in opts)
        raise UserError(f"{where}: expected {names}, got {value!r}", f"set {where} to a {names}")
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{where}: expected a list, got {value!r}", f"e.g. {where}=[a,b]")
        (item,) = typing.get_args(hint)
        return [_coerce(f"{where}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {value!r}", f"e.g. {where}={{k: v}}")
        _, vt = typing.get_args(hint)
        return {str(k): _coerce(f"{where}.{k}", v, vt) for k, v in value.items()}
    if hint is Any:
        return value
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # precision: 32 and precision: "32" are the same
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise UserError(
        f"{where}: expected {_tname(hint)}, got {value!r} ({type(value).__name__})",
        f"set {where} to a value of type {_tname(hint)}",
    )


def _section(where: str, value: Any, cls: Any) -> Any:
    if isinstance(value, str) and "args" in {f.name for f in dataclasses.fields(cls)}:
        value = {"name": value}  # `model: resnet18` is short for `model: {name: resnet18}`
    if value is None and where == "sched":
        value = {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a mapping, got {value!r}", f"e.g. {where}.name=...")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    has_args = "args" in fields
    kwargs: dict[str, Any] = {}
    args: dict[str, Any] = {}
    for key, v in value.items():
        if key in fields and key != "args":
            kwargs[key] = _check_field(
                f"{where}.{key}", _coerce(f"{where}.{key}", v, hints[key]), fields[key]
            )
        elif has_args:
            args[key] = v
        else:
            valid = [k for k in fields if k != "args"]
            raise UserError(
                f"unknown key '{where}.{key}'.{did_you_mean(key, valid)} Valid: {choices_text(valid)}",
                f"remove {where}.{key} or fix its spelling",
            )
    for name, f in fields.items():
        if (
            name not in kwargs
            and name != "args"
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            raise UserError(f"{where}.{name} is required", f"set {where}.{name}=...")
    if has_args:
        kwargs["args"] = args
    return cls(**kwargs)


# what users of other tools write, and the value meant here (suggested, never silently accepted)
_ALIASES = {
    "gpu": "cuda",
    "fp16": "16",
    "float16": "16",
    "half": "16",
    "16-mixed": "16",
    "bfloat16": "bf16",
    "bf16-mixed": "bf16",
    "fp32": "32",
    "float32": "32",
    "32-true": "32",
}


def _check_field(where: str, value: Any, f: dataclasses.Field[Any]) -> Any:
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
        alias = _ALIASES.get(str(value).lower())
        suggest = (
            f" Did you mean '{alias}'?"
            if alias in choices
            else did_you_mean(str(value), [str(c) for c in choices])
        )
        raise UserError(
            f"{where}: '{value}' is not one of: {shown}.{suggest}",
            f"set {where} to one of: {shown}",
        )
    low = f.metadata.get("min")
    if low is not None and value is not None and value < low:
        raise UserError(f"{where}: {value} is below the minimum {low:g}", f"set {where} >= {low:g}")
    return value


def _tname(t: Any) -> str:
    return "null" if t is type(None) else getattr(t, "__name__", str(t))


# ---------------------------------------------------------------------------------------------
# saving and loading the frozen config
# ---------------------------------------------------------------------------------------------

CONFIG_FILE = "config.yaml"


def to_yaml(cfg: Config) -> str:
    """The frozen config as YAML text."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(cfg.to_dict()))


def load(run_dir: str | Path) -> Config:
    """Read RUN_DIR/config.yaml back into a Config (no composition, no Hydra)."""
    import yaml

    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise UserError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE})",
            "pass the folder printed at the start of a run",
        )
    return validate(yaml.safe_load(path.read_text()), check_components=False)
