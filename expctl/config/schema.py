"""The config schema: the one place that states every key, type and default.

Fixed sections (train, checkpoint, run, launcher, sweep) are dataclasses; Hydra composes against
them (they are stored in its ConfigStore by `compose.py`) and OmegaConf checks the types. Component
sections (model, data, optim, sched, loss) hold a registered ``name``, a few framework keys
(``data.batch_size``, ``sched.interval``), and the factory's own arguments, whose defaults come
from its signature (registry). On top of OmegaConf's types: ranges, choices with did-you-mean,
finite floats, and cross-section checks, all raised as UserError.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl import registry
from expctl.config.yamlfile import read_yaml
from expctl.errors import CONTROL, UserError, choices_text, did_you_mean
from expctl.layout import RunDir


def _f(
    default: Any,
    *,
    choices: tuple[Any, ...] = (),
    min: float | None = None,
    max: float | None = None,
) -> Any:
    meta: dict[str, Any] = {}
    if choices:
        meta["choices"] = choices
    if min is not None:
        meta["min"] = min
    if max is not None:
        meta["max"] = max
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# the longest a rank waits for a peer: 30 days, a bound well inside what Python's and torch's
# timers take (1e308 s overflowed them in a traceback); a peer silent for longer is gone
MAX_WAIT_S = 30 * 86400


@dataclass(frozen=True)
class EarlyStopConfig:
    """Stop training once a validation metric stops improving."""

    monitor: str | None = None  # a validation metric (val/loss, val/acc); null: never stop early
    patience: int = _f(3, min=1)  # validations in a row without improvement
    min_delta: float = _f(0.0, min=0)  # an improvement is a change by more than this
    mode: str = _f("min", choices=("min", "max"))  # min: lower is better


DEFAULT_EPOCHS = 3  # train.max_epochs when neither it nor train.max_steps is given


@dataclass(frozen=True)
class TrainConfig:
    """How the loop runs."""

    # stop after this many epochs or optimizer steps, whichever comes first; max_epochs null:
    # 3 epochs, or as many as max_steps takes when it is set (Lightning's rule)
    max_epochs: int | None = _f(None, min=1)
    max_steps: int | None = _f(None, min=1)
    precision: str = _f("auto", choices=("auto", "32", "bf16", "16"))  # auto: bf16 on capable GPUs
    grad_accum: int = _f(1, min=1)  # micro-batches per optimizer step
    grad_clip: float | None = _f(None, min=0)  # max global gradient norm
    seed: int = _f(0, min=0, max=2**63 - 1)  # torch's generators take 64 bits (+ rank, epoch)
    log_every: int = _f(50, min=1)  # steps between log lines (the only host syncs)
    val_every: int = _f(1, min=1)  # epochs between validations (and always at the end)
    val_every_steps: int | None = _f(None, min=1)  # also validate every N optimizer steps
    limit_val_batches: int | None = _f(None, min=1)  # validations: N batches per rank (debug)
    step: str = "supervised"  # registered training step
    device: str = _f("auto", choices=("auto", "cpu", "cuda"))
    channels_last: Any = _f("auto", choices=("auto", True, False))  # auto: conv nets on CUDA
    compile: bool = False  # torch.compile the models (warm-up cost: see bench/RESULTS.md)
    compile_mode: str = _f(
        "default",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )  # torch.compile's mode (reduce-overhead: CUDA graphs)
    on_nan: str = _f("stop", choices=("stop", "skip"))
    gc_every: int = _f(50, min=0)  # steps between the ranks' joint Python GC runs (0: Python's)
    sync_batchnorm: bool = False  # SyncBatchNorm across ranks instead of per-rank statistics
    early_stop: EarlyStopConfig = _f(EarlyStopConfig())
    # optimizer and loss settings from a step on: [{step: 400, optim: {lr: 0.02}}]; Population
    # Based Training's trials continue with one, and `sweep best` writes the best trial's
    hparam_schedule: list[dict[str, Any]] = _f([])


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written, how many are kept, and where training resumes from."""

    every: int = _f(0, min=0)  # optimizer steps between checkpoints; 0 = end of each epoch
    keep: int = _f(2, min=1)  # the newest K; with `monitor`: the best K by it, plus the newest
    monitor: str | None = None  # a validation metric (val/acc): every validation saves, best kept
    mode: str = _f("min", choices=("min", "max"))  # min: lower `monitor` is better
    resume: str = "auto"  # auto | never | PATH of a checkpoint
    init: str | None = None  # weights-only start: a checkpoint, a state-dict file or a run dir
    init_strict: bool = True  # false: load the weights that match and list the rest


@dataclass(frozen=True)
class RunConfig:
    """Where the run directory goes."""

    root: str = "runs"
    name: str = "${model.name}-${data.name}"
    dir: str | None = None  # an exact run directory (else root/name-ID)


@dataclass(frozen=True)
class InlineLauncher:
    """Train in this process (or in each task torchrun / srun started)."""

    name: str = "inline"
    rdzv_timeout: float = _f(120.0, min=1, max=MAX_WAIT_S)  # seconds a rank waits for rank 0
    collective_timeout: float = _f(1800.0, min=1, max=MAX_WAIT_S)
    # preemption and time limits: the signal that asks for checkpoint + requeue
    signal: str = _f("USR2", choices=("USR1", "USR2", "TERM", "INT", "HUP", "URG"))
    max_requeues: int = _f(3, min=0)


@dataclass(frozen=True)
class LocalLauncher(InlineLauncher):
    """N worker processes on this machine through torch's elastic agent."""

    name: str = "local"
    nproc: int = _f(2, min=1)
    max_restarts: int = _f(0, min=0)  # restarts of all workers after one dies


@dataclass(frozen=True)
class SlurmLauncher(InlineLauncher):
    """Submit to Slurm through submitit."""

    name: str = "slurm"
    nodes: int = _f(1, min=1)
    tasks_per_node: int | None = _f(None, min=1)  # null: gpus_per_node, or 1 without GPUs
    gpus_per_node: int = _f(0, min=0)
    cpus_per_task: int | None = _f(None, min=1)
    mem_gb: float | None = _f(None, min=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    timeout_min: int = _f(60, min=1)
    job_name: str | None = None  # null: run.name
    sbatch: dict[str, Any] = _f({})  # any other sbatch option: launcher.sbatch.mail-type=END
    setup: list[str] = _f([])  # shell lines before training (module load ...)
    signal_delay_s: int = _f(90, min=0)  # the signal comes this long before the time limit
    # the code the job imports, copied when submitted (queued jobs run what was submitted):
    # git: the tracked files of your repository; imports: the `imports:` modules' packages;
    # auto: git when your repository holds those modules, else imports; none: the files on disk
    snapshot: str = _f("auto", choices=("auto", "git", "imports", "none"))
    snapshot_max_mb: float = _f(50.0, min=0)  # refuse to submit a larger snapshot


@dataclass(frozen=True)
class LauncherConfig(SlurmLauncher, LocalLauncher):
    """Every launcher key at runtime; a config holds only those of its launcher."""

    name: str = _f("inline", choices=("inline", "local", "slurm"))
    nproc: int = _f(1, min=1)


LAUNCHERS: dict[str, type] = {
    "inline": InlineLauncher,
    "local": LocalLauncher,
    "slurm": SlurmLauncher,
}


@dataclass(frozen=True)
class PBTConfig:
    """Population Based Training: every `interval` validations, a trial in the bottom
    `quantile` continues from a top trial's checkpoint with perturbed hyperparameters."""

    interval: int = _f(1, min=1)  # validations between exploit/explore rounds of a trial
    quantile: float = _f(0.25, min=0)  # bottom (and top) fraction of the population: (0, 0.5]
    resample_probability: float = _f(0.25, min=0, max=1)  # explore: draw anew instead of perturbing
    factors: list[float] = _f([0.8, 1.2])  # explore: a float/int value times one of these


@dataclass(frozen=True)
class SweepConfig:
    """How `-m` explores: sampler, objective, early stopping of bad trials, and how many trials
    run side by side on which share of the machine."""

    sampler: str = _f("grid", choices=("grid", "random", "tpe"))
    n_trials: int | None = _f(None, min=1)  # null: every grid point; random/tpe: 10
    metric: str = "val/acc"
    mode: str = _f("max", choices=("max", "min"))
    pruner: str = _f("none", choices=("none", "asha", "median"))
    budget: str = _f("epoch", choices=("epoch", "step"))  # the unit trials report progress in
    grace: int = _f(1, min=1)  # ASHA: budget every trial gets; median: warm-up before pruning
    reduction: int = _f(3, min=2)  # ASHA: keep the top 1/reduction at each rung
    repeat: int = _f(1, min=1)  # seeds per configuration
    seed: int = _f(0, min=0, max=2**32 - 1)  # the sampler's seed (NumPy's range)
    stop_on_failure: bool = False
    params: dict[str, str] = _f({})  # search space: {optim.lr: "tag(log, interval(1e-4, 1e-1))"}
    max_concurrent: int | None = _f(None, min=1)  # trials at once; null: what the machine holds
    # a fraction (0.25: four trials per GPU) or N whole GPUs (an N-rank DDP trial); null: 1 GPU
    # where there are GPUs, none on a CPU-only machine
    gpus_per_trial: float | None = _f(None, min=0)
    cpus_per_trial: int | None = _f(None, min=1)  # null: the cores divided evenly
    scheduler: str = _f("none", choices=("none", "pbt"))  # pbt: Population Based Training
    pbt: PBTConfig = _f(PBTConfig())


@dataclass(frozen=True)
class ModelConfig:
    """A registered model (or a dict of models) and its constructor arguments."""

    name: str
    args: dict[str, Any] = _f({})


@dataclass(frozen=True)
class DataConfig:
    """A registered dataset, its arguments, and how it is batched."""

    name: str
    batch_size: int = _f(128, min=1)  # per worker; the global batch is batch_size x world size
    val_batch_size: int | None = _f(None, min=1)  # null: batch_size
    num_workers: int | None = _f(None, min=0)  # DataLoader workers per rank; null: cores/ranks - 1
    pin_memory: Any = _f("auto", choices=("auto", True, False))  # auto: on CUDA
    persistent_workers: bool = True  # ignored: workers are started once and kept for the run
    prefetch_factor: int | None = _f(None, min=1)  # batches each worker reads ahead; null: 2
    timeout: float = _f(300.0, min=1)  # seconds a rank waits for a batch from its workers
    device_resident: Any = _f("auto", choices=("auto", True, False))  # in-memory data on the GPU
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
    monitor: str | None = None  # a scheduler that steps on a metric (reducelronplateau): which
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
    imports: list[str] = _f([])  # your modules, imported in every process before building
    logger: dict[str, dict[str, Any]] = _f(
        {}
    )  # loggers (expctl/builtin/loggers.py) -> their arguments
    env: dict[str, str] = _f({})  # environment variables set in every worker
    # dotted key -> its `${oc.env:...}` text: written back instead of the value (secrets)
    interpolations: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self, resolved: bool = False) -> dict[str, Any]:
        """Plain nested dict as written to config.yaml: component arguments next to ``name``,
        only the chosen launcher's keys, environment interpolations unresolved (unless
        `resolved`: the values this process uses)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "interpolations":
                continue
            value = copy.deepcopy(getattr(self, f.name))  # what is written never changes self
            if dataclasses.is_dataclass(value):
                keep = _section_fields(f.name, value)
                d = {k: _plain_value(getattr(value, k)) for k in keep}
                d.update(d.pop("args", {}) or {})
                out[f.name] = d
            else:
                out[f.name] = value
        for path, text in () if resolved else self.interpolations.items():
            *parents, leaf = _path(path)
            _set(_lookup(out, parents), leaf, text)
        return out

    def replace(self, section: str, **changes: Any) -> Config:
        """A copy with `changes` applied to one section."""
        return dataclasses.replace(
            self, **{section: dataclasses.replace(getattr(self, section), **changes)}
        )


def _plain_value(value: Any) -> Any:
    """A section inside a section (train.early_stop) as a plain dict."""
    is_section = dataclasses.is_dataclass(value) and not isinstance(value, type)
    return dataclasses.asdict(value) if is_section else value


def _section_fields(section: str, value: Any) -> list[str]:
    cls = LAUNCHERS[value.name] if section == "launcher" else type(value)
    return [f.name for f in dataclasses.fields(cls)]


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "sched": SchedConfig,
    "loss": LossConfig,
}
COMPONENT_KINDS = {
    "model": "models",
    "data": "datasets",
    "optim": "optimizers",
    "sched": "schedulers",
    "loss": "losses",
}
FIXED: dict[str, type] = {
    "train": TrainConfig,
    "checkpoint": CheckpointConfig,
    "run": RunConfig,
    "sweep": SweepConfig,
}


def framework_keys(section: str) -> dict[str, dataclasses.Field[Any]]:
    """The keys a component section holds besides the factory's arguments (name included);
    none for a logger."""
    if section not in SECTIONS:
        return {}
    return {f.name: f for f in dataclasses.fields(SECTIONS[section]) if f.name != "args"}


def validate(
    raw: dict[str, Any],
    check_components: bool = True,
    interpolations: dict[str, str] | None = None,
) -> Config:
    """Check a composed, resolved dict and build the frozen Config.

    Args:
        raw: the output of composition (or a loaded config.yaml), interpolations resolved.
        check_components: also check names and arguments against the registries (imports
            `imports:` modules and the built-ins, which imports torch).
        interpolations: dotted key -> `${oc.env:...}` text, kept unresolved when written.

    Raises:
        UserError: unknown keys (with did-you-mean), wrong types, out-of-range values.
    """
    if not isinstance(raw, dict):
        raise UserError("the config must be a mapping of sections")
    known = {f.name for f in dataclasses.fields(Config)} - {"interpolations"}
    for key in raw:
        if key not in known:
            owner = next(
                (s for s, c in FIXED.items() if key in {f.name for f in dataclasses.fields(c)}),
                None,
            )
            guess = f" Did you mean '{owner}.{key}'?" if owner else did_you_mean(key, known)
            raise UserError(
                f"unknown config section '{key}'.{guess} Valid: {choices_text(known)}",
                f"put it under its section: {owner}: {{{key}: ...}}"
                if owner
                else "remove it, or fix its spelling",
            )
    for name in ("model", "data", "optim", "loss"):
        if raw.get(name) is None:
            raise UserError(f"the config has no '{name}' section", f"add {name}=NAME")
    values: dict[str, Any] = {"interpolations": dict(interpolations or {})}
    for name, value in raw.items():
        if name in SECTIONS:
            values[name] = _component(name, value)
        elif name in FIXED:
            values[name] = _typed(name, FIXED[name], value)
        elif name == "launcher":
            values[name] = _launcher(value)
        else:
            values[name] = _plain(name, value)
    _check_finite("", raw)
    train = values.get("train")
    if isinstance(train, TrainConfig) and train.max_epochs is None and train.max_steps is None:
        values["train"] = dataclasses.replace(train, max_epochs=DEFAULT_EPOCHS)
    cfg = Config(**values)
    _cross_checks(cfg)
    if check_components:
        check_registered(cfg)
    return cfg


def check_registered(cfg: Config) -> None:
    """Check every component name and argument against the registries."""
    registry.import_user_modules(cfg.imports)
    for section, kind in COMPONENT_KINDS.items():
        comp = getattr(cfg, section)
        if comp.name is None:
            continue
        registry.check_args(kind, comp.name, comp.args, section)
    registry.get("steps", cfg.train.step)
    for i, entry in enumerate(cfg.train.hparam_schedule):
        for section in set(entry) & set(HPARAM_SECTIONS):
            comp = getattr(cfg, section)
            where = f"train.hparam_schedule[{i}].{section}"
            registry.check_args(
                COMPONENT_KINDS[section], comp.name, {**comp.args, **entry[section]}, where
            )
    for name, args in cfg.logger.items():
        registry.check_args("loggers", name, args, f"logger.{name}")
    if cfg.sched.name is not None:
        steps_on_metric = "monitor" in registry.get("schedulers", cfg.sched.name).settings
        if steps_on_metric != (cfg.sched.monitor is not None):
            raise UserError(
                f"sched.monitor={cfg.sched.monitor}: sched={cfg.sched.name} "
                + ("steps on a metric and needs one" if steps_on_metric else "steps on no metric"),
                "set sched.monitor=val/loss (or another validation metric)"
                if steps_on_metric
                else "remove sched.monitor, or use sched=reducelronplateau",
            )


HPARAM_SECTIONS = ("optim", "loss")  # what can change mid-run: param groups, loss settings


def check_hparam_schedule(cfg: Config) -> None:
    """train.hparam_schedule: entries of `step` (increasing) and optim / loss arguments, none of
    them a learning rate that a scheduler also sets.

    Raises:
        UserError: anything else, naming the entry.
    """
    last = -1
    for i, entry in enumerate(cfg.train.hparam_schedule):
        where = f"train.hparam_schedule[{i}]"
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int) or isinstance(step, bool) or step <= last:
            raise UserError(
                f"{where}: each entry needs a `step` (an integer, increasing): got {step!r}",
                "e.g. train.hparam_schedule=[{step: 0, optim: {lr: 0.1}}, {step: 400, optim: "
                "{lr: 0.01}}]",
            )
        last = step
        for key, values in entry.items():
            if key == "step":
                continue
            if key not in HPARAM_SECTIONS or not isinstance(values, dict) or "name" in values:
                raise UserError(
                    f"{where}.{key}: only optimizer and loss arguments can change mid-run "
                    f"(optim: {{...}}, loss: {{...}})",
                    "keep the component and the model as they are; change optim.* / loss.* "
                    "arguments only",
                )
        if "lr" in entry.get("optim", {}) and cfg.sched.name is not None:
            raise UserError(
                f"{where}.optim.lr: sched={cfg.sched.name} sets the learning rate too",
                "use sched=none with a learning-rate schedule of your own",
            )


def _typed(where: str, cls: type, value: Any) -> Any:
    """`value` checked against the dataclass `cls` by OmegaConf (types, unknown keys), then
    against the fields' choices and minimums; returns an instance of `cls`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a mapping, got {value!r}", f"e.g. {where}.KEY=VALUE")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            raise unknown_key(where, str(key), list(fields))
    free = {k: v for k, v in value.items() if fields[k].type == "Any"}
    for key, v in value.items():  # a section inside the section (train.early_stop)
        inner = fields[key].default
        if dataclasses.is_dataclass(inner) and not isinstance(v, type(inner)):
            free[key] = _typed(f"{where}.{key}", type(inner), v)
    typed = {k: v for k, v in value.items() if k not in free}
    try:
        node = OmegaConf.merge(_structured(cls), typed)  # merge copies it
        obj = OmegaConf.to_object(node)
    except ValidationError as e:
        key = str(getattr(e, "full_key", "") or "")
        bad = typed.get(key.split(".")[0]) if key else None
        expected = _type_name(fields[key.split(".")[0]].type) if key in fields else "another type"
        raise UserError(
            f"{where}.{key}: expected {expected}, got {bad!r}",
            f"set {where}.{key} to a value of type {expected}",
        ) from None
    except (ConfigKeyError, OmegaConfBaseException) as e:
        raise UserError(f"{where}: {' '.join(str(e).split())[:200]}") from None
    obj = dataclasses.replace(obj, **free)  # type: ignore[type-var]
    checked = {
        key: _check_field(f"{where}.{key}", getattr(obj, key), f) for key, f in fields.items()
    }
    return dataclasses.replace(obj, **checked)  # type: ignore[type-var]


_STRUCTURED: dict[type, Any] = {}


def _structured(cls: type) -> Any:
    """OmegaConf's node of the dataclass `cls`, made once (a sweep validates every point)."""
    from omegaconf import OmegaConf

    if cls not in _STRUCTURED:
        _STRUCTURED[cls] = OmegaConf.structured(cls)
    return _STRUCTURED[cls]


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace(" | None", " or null")
    return {"int": "int", "float": "float", "str": "str", "bool": "bool"}.get(text, text)


def _component(section: str, value: Any) -> Any:
    cls = SECTIONS[section]
    if isinstance(value, str) or (value is None and section == "sched"):
        value = {"name": value}  # `model: resnet18` is short for `model: {name: resnet18}`
    if not isinstance(value, dict):
        raise UserError(f"{section}: expected a mapping, got {value!r}", f"e.g. {section}.name=...")
    own = framework_keys(section)
    if "name" not in value and section != "sched":
        raise UserError(f"{section}.name is required", f"set {section}=NAME")
    frame = _typed(section, _without_args(cls), {k: v for k, v in value.items() if k in own})
    args = {str(k): v for k, v in value.items() if k not in own}
    return cls(**{k: getattr(frame, k) for k in own}, args=args)


_NO_ARGS: dict[type, type] = {}


def _without_args(cls: type) -> type:
    """`cls` without its ``args`` field: the framework keys OmegaConf checks."""
    if cls not in _NO_ARGS:
        fields = [
            (f.name, f.type, field(default=f.default, metadata=f.metadata))
            if f.default is not dataclasses.MISSING
            else (f.name, f.type)
            for f in dataclasses.fields(cls)
            if f.name != "args"
        ]
        made = dataclasses.make_dataclass(cls.__name__, fields, frozen=True)
        made.__module__ = __name__  # its annotations are evaluated here
        _NO_ARGS[cls] = made
    return _NO_ARGS[cls]


def _launcher(value: Any) -> LauncherConfig:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise UserError(f"launcher: expected a mapping, got {value!r}", "e.g. launcher=local")
    name = value.get("name", "inline")
    if name not in LAUNCHERS:
        raise UserError(
            f"launcher: no '{name}' launcher.{did_you_mean(str(name), LAUNCHERS)} "
            f"Valid: {choices_text(LAUNCHERS)}",
            "launcher=inline (this process), local (N workers here) or slurm (submitit)",
        )
    cls = LAUNCHERS[name]
    for key in value:
        if key not in {f.name for f in dataclasses.fields(cls)}:
            owners = [
                n for n, c in LAUNCHERS.items() if key in {f.name for f in dataclasses.fields(c)}
            ]
            if owners:
                raise UserError(
                    f"'launcher.{key}' is not a key of launcher={name}.",
                    f"launcher={owners[0]} has it: pick that launcher first",
                )
    chosen = _typed("launcher", cls, value)
    return LauncherConfig(**dataclasses.asdict(chosen))


def _loggers(value: Any) -> dict[str, dict[str, Any]]:
    """`logger`: a list of logger names, or a mapping of names to their arguments."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {v: {} for v in value}
    if isinstance(value, dict) and all(isinstance(v, dict) or v is None for v in value.values()):
        return {str(k): dict(v or {}) for k, v in value.items()}
    raise UserError(
        f"logger: expected a list of logger names or a mapping of them, got {value!r}",
        "e.g. logger=[tensorboard,csv]; `expctl list loggers` names them",
    )


def _plain(name: str, value: Any) -> Any:
    if name == "logger":
        return _loggers(value)
    if name == "imports":
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(
                f"imports: expected a list of module names, got {value!r}",
                "e.g. imports=[my_components]",
            )
        for module in value:
            registry.check_module_name(module)
        return list(value)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"env: expected a mapping, got {value!r}", "e.g. env.NCCL_DEBUG=INFO")
    out = {}
    for key, v in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise UserError(
                f"env.{str(key)!r}: not an environment variable name", "use letters, digits and _"
            )
        if v is None or isinstance(v, (dict, list)):
            raise UserError(f"env.{key}: expected a string value", f"e.g. env.{key}=VALUE")
        out[str(key)] = str(v).lower() if isinstance(v, bool) else str(v)
        if "\0" in out[str(key)]:  # the one character an environment variable cannot hold
            raise UserError(
                f"env.{key}={out[str(key)]!r}: a NUL byte cannot go into an environment variable",
                f"remove it from env.{key}",
            )
    return out


def _check_finite(prefix: str, value: Any) -> None:
    """Every float of the config is finite: NaN and infinity are never a setting."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(
            f"{prefix}={value}: not a finite number",
            f"set {prefix} to a finite value (NaN and infinity are refused everywhere)",
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(f"{prefix}[{i}]", v)


def unknown_key(where: str, key: str, valid: list[str]) -> UserError:
    """The error for a key `where.key` that the section lacks."""
    return UserError(
        f"unknown key '{where}.{key}'.{did_you_mean(key, valid)} Valid: {choices_text(valid)}",
        f"remove {where}.{key} or fix its spelling (`expctl show` prints every key)",
    )


_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+=-]+")


def plain_text(where: str, value: str | None) -> None:
    """Refuse control characters (NUL, newline, tab, ...) in a value bound for a file name, an
    environment variable or a line of a job script, naming the value quoted on one line."""
    if value is not None and CONTROL.search(value):
        raise UserError(
            f"{where}={value!r}: control characters (NUL, newline, tab, ...) cannot go into a "
            "file name, an environment variable or a job script",
            f"remove them from {where}",
        )


def check_name(where: str, name: str) -> None:
    """A name that becomes a file or folder name: letters, digits and _ . + = - only.

    Raises:
        UserError: anything else ('/', '..', spaces, quotes, shell characters).
    """
    if not _NAME_CHARS.fullmatch(name) or name.startswith(".") or ".." in name:
        raise UserError(
            f"{where}={name!r}: it becomes a file or folder name and may only hold "
            "ASCII letters, digits and _ . + = - (no '/', '..', spaces, quotes, shell characters "
            "or accents)",
            f"pick a plain name, e.g. {where}=resnet18-lr0.1"
            + ("; use run.root / run.dir for the place" if where == "run.name" else ""),
        )


def check_path_length(where: str, path: str | None, inside: int = 0) -> None:
    """A folder whose files' paths fit the system's limits: each name at most NAME_MAX bytes,
    the whole (absolute, with `inside` bytes of what goes in it) under PATH_MAX.

    Raises:
        UserError: too long, before anything is created.
    """
    if path is None:
        return
    limits = []
    for name, default in (("PC_PATH_MAX", 4096), ("PC_NAME_MAX", 255)):
        try:
            limits.append(os.pathconf("/", name))
        except (OSError, ValueError):
            limits.append(default)
    full = os.fsencode(os.path.abspath(os.path.expanduser(path)))
    longest = max((len(part) for part in full.split(b"/")), default=0)
    if len(full) + inside >= limits[0] or longest > limits[1]:
        raise UserError(
            f"{where} is too long here ({len(full)} bytes, a name of {longest}): a run's files "
            f"need paths under {limits[0]} bytes and names of at most {limits[1]}",
            f"pick a shorter {where}",
        )


def _cross_checks(cfg: Config) -> None:
    t, ln = cfg.train, cfg.launcher
    for key in ("dir", "root"):
        plain_text(f"run.{key}", getattr(cfg.run, key))
    # room for root/NAME-YYYYmmdd-HHMMSS-xxxx/ and the deepest file a run writes inside (W&B's)
    check_path_length("run.root", cfg.run.root, inside=len(cfg.run.name) + 300)
    check_path_length("run.dir", cfg.run.dir, inside=300)
    plain_text("checkpoint.resume", cfg.checkpoint.resume)
    check_name("run.name", cfg.run.name)
    if ln.name == "slurm":
        check_slurm(cfg)
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).expanduser().exists():
        raise UserError(
            f"checkpoint.resume: no checkpoint at '{resume}'",
            "use auto (latest in the run directory), never, or the path of a .pt checkpoint",
        )
    _check_init(cfg.checkpoint)
    for where, name in monitors(cfg).items():
        if not name.startswith("val/"):
            raise UserError(
                f"{where}={name}: only validation metrics (val/...) can be monitored",
                f"e.g. {where}=val/loss or {where}=val/acc",
            )
    if t.compile_mode != "default" and not t.compile:
        raise UserError(
            f"train.compile_mode={t.compile_mode} does nothing without train.compile=true",
            "add train.compile=true, or drop train.compile_mode",
        )
    check_hparam_schedule(cfg)
    if t.grad_accum > 1 and t.step != "supervised":
        raise UserError(
            f"train.grad_accum={t.grad_accum} is handled by the supervised step only "
            f"(train.step={t.step})",
            "set train.grad_accum=1, or accumulate inside your own step",
        )


def monitors(cfg: Config) -> dict[str, str]:
    """The metrics the run acts on, by the key that names each: best checkpoints, early
    stopping, a scheduler that steps on a metric."""
    named = {
        "checkpoint.monitor": cfg.checkpoint.monitor,
        "train.early_stop.monitor": cfg.train.early_stop.monitor,
        "sched.monitor": cfg.sched.monitor,
    }
    return {k: v for k, v in named.items() if v is not None}


def _check_init(ck: CheckpointConfig) -> None:
    plain_text("checkpoint.init", ck.init)
    if ck.init is None:
        return
    if not Path(ck.init).expanduser().exists():
        raise UserError(
            f"checkpoint.init: nothing at '{ck.init}'",
            "give an expctl checkpoint (.pt), a file saved with torch.save(model.state_dict()), "
            "or a run directory (its best checkpoint, else its newest)",
        )
    if ck.resume not in ("auto", "never"):
        raise UserError(
            f"checkpoint.init={ck.init} and checkpoint.resume={ck.resume}: pick one",
            "init starts from weights only (a new optimizer, step 0); resume restores all of it",
        )


# what reaches an sbatch script: values from a strict character set (submitit quotes them too)
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.,:+@%=/\[\]-]+")
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9_-]*")
SBATCH_MANAGED = frozenset(
    {
        "signal",
        "requeue",
        "output",
        "error",
        "open-mode",
        "array",
        "nodes",
        "ntasks-per-node",
        "time",
    }
)


def check_slurm(cfg: Config) -> None:
    """Every launcher=slurm value bound for the sbatch script is safe there: checked when the
    config is validated, before `expctl show` prints anything or a job is written."""
    ln = cfg.launcher
    tasks_per_node(ln)
    for key, value in ln.sbatch.items():
        option = str(key).replace("_", "-")
        if not _SBATCH_KEY.fullmatch(option) or option in SBATCH_MANAGED:
            raise UserError(
                f"{'launcher.sbatch.' + str(key)!r}: not an sbatch option expctl lets you set here",
                "use lowercase option names (e.g. mail-type); nodes, time, signal and requeue "
                "have their own keys",
            )
        sbatch_value(f"launcher.sbatch.{option}", value)
    sbatch_value("launcher.job_name", ln.job_name or cfg.run.name)
    for key in ("cpus_per_task", "partition", "account", "qos", "constraint"):
        if getattr(ln, key) is not None:
            sbatch_value(f"launcher.{key}", getattr(ln, key))
    for i, line in enumerate(ln.setup):
        plain_text(f"launcher.setup[{i}]", str(line))


def sbatch_value(where: str, value: Any) -> Any:
    """`value` if it may go on an #SBATCH line (a number, or text of safe characters)."""
    if isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, str) or not _SBATCH_VALUE.fullmatch(value):
        raise UserError(
            f"{where}={value!r}: sbatch values may only hold letters, digits and "
            "_ . , : + @ % = / [ ] -",
            "remove spaces, quotes, ';', '$', backquotes and newlines from the value",
        )
    return value


def tasks_per_node(ln: LauncherConfig) -> int:
    """Slurm tasks per node: launcher.tasks_per_node, else one per GPU (or 1 without GPUs)."""
    tasks = ln.tasks_per_node or (ln.gpus_per_node or 1)
    if ln.gpus_per_node and tasks != ln.gpus_per_node:
        raise UserError(
            f"launcher.tasks_per_node={tasks} but launcher.gpus_per_node={ln.gpus_per_node}",
            f"use one task per GPU: launcher.tasks_per_node={ln.gpus_per_node} (or leave it null)",
        )
    return tasks


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
    if choices and True in choices and isinstance(value, str):
        value = {"true": True, "false": False}.get(value.lower(), value)  # "true" from a file
    if choices and not any(value == c and type(value) is type(c) for c in choices):
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
    low, high = f.metadata.get("min"), f.metadata.get("max")
    if low is not None and value is not None and value < low:
        raise UserError(f"{where}: {value} is below the minimum {low:g}", f"set {where} >= {low:g}")
    if high is not None and value is not None and high < value < math.inf:  # inf: not finite
        raise UserError(
            f"{where}: {value} is above the maximum {high}", f"set {where} to at most {high}"
        )
    return value


# ---------------------------------------------------------------------------------------------
# saving and loading the frozen config
# ---------------------------------------------------------------------------------------------


def to_yaml(cfg: Config, frozen: bool = True) -> str:
    """The config as YAML text. Frozen (config.yaml) leaves ``run.dir`` out: a run directory is
    where its config.yaml lies (a moved run resumes there; the file reused with -C starts a new
    run)."""
    from omegaconf import OmegaConf

    d = cfg.to_dict()
    if frozen:
        d["run"]["dir"] = None
    return OmegaConf.to_yaml(OmegaConf.create(d))


def load(run_dir: str | Path, path: Path | None = None) -> Config:
    """Read RUN_DIR/config.yaml (or another frozen config of that run, `path`) back into a
    Config (no composition, no Hydra); environment interpolations resolve in this process's
    environment."""
    from omegaconf import OmegaConf

    path = path or RunDir(run_dir).config
    if not path.is_file():
        raise UserError(
            f"{run_dir}: not a run directory (no {RunDir.CONFIG})",
            "pass the folder printed at the start of a run",
        )
    node = OmegaConf.create(
        read_yaml(path, str(path), empty="restore it from a copy, or start a new run elsewhere")
    )
    raw, interps = resolve(node, f"{path}")
    drop_legacy(raw)
    with redacted(raw, interps):
        cfg = validate(raw, check_components=False, interpolations=interps)
    return cfg.replace("run", dir=str(Path(run_dir).expanduser().absolute()))


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys -> values (`{"optim": {"lr": 0.1}}` -> `optim.lr`); lists
    and empty mappings are values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


LEGACY_KEYS = ("storage", "trial")  # sweep.*, written into trials' configs before 0.2


def drop_legacy(raw: dict[str, Any]) -> None:
    """Forget the runtime keys that configs frozen by expctl 0.1 hold (a trial's identity now
    lives in RUN_DIR/trial.json)."""
    sweep = raw.get("sweep")
    if isinstance(sweep, dict):
        for key in LEGACY_KEYS:
            sweep.pop(key, None)


def resolve(node: Any, where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A resolved plain dict of an OmegaConf node, and the dotted keys whose values come from
    ``${oc.env:...}`` (directly or through another key), with their unresolved text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    raw = OmegaConf.to_container(node, resolve=False)
    found: dict[str, str] = {}
    _interpolations("", raw, found)
    try:
        resolved = OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as e:
        unset = re.search(r"Environment variable '([A-Za-z0-9_]+)' not found", str(e))
        if unset:
            raise _unset_variable(unset.group(1), found, where) from None
        msg = " ".join(str(e).split("\n")[0].split())
        for name in set(re.findall(r"oc\.env:([A-Za-z0-9_]+)", " ".join(found.values()))):
            value = os.environ.get(name)
            if value:  # never print what the environment holds
                msg = msg.replace(value, f"${{oc.env:{name}}}")
        raise UserError(
            f"{where}: {msg}", "check ${...} interpolations; ${oc.env:NAME} needs NAME set"
        ) from None
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}, _from_environment(raw, found, resolved)


_ENV_RESOLVER = re.compile(r"\boc\.env(?=\s*:)")
_PROBE = "expctl.env_probe"


def _from_environment(raw: Any, found: dict[str, str], resolved: Any) -> dict[str, str]:
    """The interpolated keys whose values depend on the environment, however they reach it
    (``${oc.env:..}``, a key that holds one, ``oc.select``, a relative key, ``oc.dict.values``,
    a parent node): those whose value changes when every ``oc.env`` returns one of its own."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not any(_ENV_RESOLVER.search(v) for v in found.values()):
        return {}  # no oc.env anywhere (run.name's default interpolates too): nothing to probe
    if not OmegaConf.has_resolver(_PROBE):
        count = iter(range(1 << 62))
        OmegaConf.register_new_resolver(
            _PROBE, lambda *_: f"expctl-env-probe-{next(count)}-{os.urandom(8).hex()}"
        )
    probe = copy.deepcopy(raw)
    for dotted, text in found.items():
        *parents, leaf = _path(dotted)
        _set(_lookup(probe, parents), leaf, _ENV_RESOLVER.sub(_PROBE, text))
    try:
        probed = OmegaConf.to_container(OmegaConf.create(probe), resolve=True)
    except OmegaConfBaseException:  # a resolver that takes only real values: keep all unresolved
        return dict(found)

    def changed(a: Any, b: Any) -> bool:  # the schema made 5 of "5": the same value
        return a != b and str(a) != str(b)

    return {
        k: v
        for k, v in found.items()
        if "oc.env" in v or changed(_lookup(resolved, _path(k)), _lookup(probed, _path(k)))
    }


def _unset_variable(name: str, interpolated: dict[str, str], where: str) -> UserError:
    keys = [k for k, v in interpolated.items() if f"oc.env:{name}" in v.replace(" ", "")]
    return UserError(
        f"{keys[0] if keys else where}: ${{oc.env:{name}}} needs the environment variable "
        f"{name}, which is not set",
        f"set it first (export {name}=...), or give a default: ${{oc.env:{name},VALUE}}",
    )


@contextlib.contextmanager
def redacted(raw: dict[str, Any], interpolations: dict[str, str]) -> Iterator[None]:
    """A UserError raised inside never shows a value that came from the environment: each is
    replaced by its ``${oc.env:...}`` text."""
    try:
        yield
    except UserError as e:
        message, hint = e.message, e.hint or ""
        for dotted, text in interpolations.items():
            value = _lookup(raw, _path(dotted))
            if value is not None and str(value):
                for shown in {str(value), repr(str(value))}:
                    message, hint = message.replace(shown, text), hint.replace(shown, text)
        raise UserError(message, hint or None) from None


def _interpolations(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _interpolations(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _interpolations(f"{prefix}[{i}]", v, out)
    elif isinstance(value, str) and "${" in value:
        out[prefix] = value


def _lookup(tree: Any, path: list[str | int]) -> Any:
    """The value at a path of keys and list indexes in nested dicts and lists, or None."""
    for part in path:
        if isinstance(tree, dict) and isinstance(part, str):
            tree = tree.get(part)
        elif isinstance(tree, list) and isinstance(part, int) and part < len(tree):
            tree = tree[part]
        else:
            return None
    return tree


def _set(node: Any, leaf: str | int, value: Any) -> None:
    in_dict = isinstance(node, dict) and isinstance(leaf, str) and leaf in node
    in_list = isinstance(node, list) and isinstance(leaf, int) and leaf < len(node)
    if in_dict or in_list:
        node[leaf] = value


def _path(dotted: str) -> list[str | int]:
    """'launcher.setup[1]' -> ['launcher', 'setup', 1]."""
    out: list[str | int] = []
    for part in dotted.split("."):
        name, *indexes = part.split("[")
        out += [name] + [int(i.rstrip("]")) for i in indexes]
    return out
