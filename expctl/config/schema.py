"""The config schema: the one place that states every key, type and default.

Fixed sections (train, checkpoint, run, launcher, sweep) are dataclasses; Hydra composes against
them (they are stored in its ConfigStore by `compose.py`) and OmegaConf checks the types. Component
sections (model, data, optim, sched, loss) hold a registered ``name``, a few framework keys
(``data.batch_size``, ``sched.interval``), and the factory's own arguments, whose defaults come
from its signature (registry). A field's metadata (choices, min, max) says what a value may be;
`validate.py` checks it, and `frozen.py` reads and writes the frozen config.yaml.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any


def setting(
    default: Any,
    *,
    choices: tuple[Any, ...] = (),
    min: float | None = None,
    max: float | None = None,
) -> Any:
    """A key of a section: its default and the values it may take (`validate.py` checks them)."""
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
    patience: int = setting(3, min=1)  # validations in a row without improvement
    min_delta: float = setting(0.0, min=0)  # an improvement is a change by more than this
    mode: str = setting("min", choices=("min", "max"))  # min: lower is better


@dataclass(frozen=True)
class FSDPConfig:
    """FSDP2's settings, for train.strategy=fsdp and hsdp."""

    # free each block's gathered weights after its forward: less memory, one more all-gather
    # per block in the backward
    reshard_after_forward: bool = True
    # hsdp: the ranks that shard a model between them (the others hold replicas of it); null:
    # the ranks of one node
    shard_size: int | None = setting(None, min=1)


DEFAULT_EPOCHS = 3  # train.max_epochs when neither it nor train.max_steps is given


@dataclass(frozen=True)
class TrainConfig:
    """How the loop runs."""

    # stop after this many epochs or optimizer steps, whichever comes first; max_epochs null:
    # 3 epochs, or as many as max_steps takes when it is set (Lightning's rule)
    max_epochs: int | None = setting(None, min=1)
    max_steps: int | None = setting(None, min=1)
    # auto: bf16 on capable GPUs
    precision: str = setting("auto", choices=("auto", "32", "bf16", "16"))
    grad_accum: int = setting(1, min=1)  # micro-batches per optimizer step
    grad_clip: float | None = setting(None, min=0)  # max global gradient norm
    seed: int = setting(0, min=0, max=2**63 - 1)  # torch's generators take 64 bits (+ rank, epoch)
    log_every: int = setting(50, min=1)  # steps between log lines (the only host syncs)
    val_every: int = setting(1, min=1)  # epochs between validations (and always at the end)
    val_every_steps: int | None = setting(None, min=1)  # also validate every N optimizer steps
    limit_val_batches: int | None = setting(None, min=1)  # validations: N batches per rank (debug)
    step: str = "supervised"  # the batch step (registered under `steps`): what one batch does
    device: str = setting("auto", choices=("auto", "cpu", "cuda"))
    channels_last: Any = setting("auto", choices=("auto", True, False))  # auto: conv nets on CUDA
    compile: bool = False  # torch.compile the models (warm-up cost: see bench/RESULTS.md)
    compile_mode: str = setting(
        "default",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )  # torch.compile's mode (reduce-overhead: CUDA graphs)
    on_nan: str = setting("stop", choices=("stop", "skip"))
    # steps between the ranks' joint Python GC runs (0: Python's)
    gc_every: int = setting(50, min=0)
    sync_batchnorm: bool = False  # SyncBatchNorm across ranks instead of per-rank statistics
    early_stop: EarlyStopConfig = setting(EarlyStopConfig())
    # how ranks hold the model: ddp (a whole copy each), fsdp (FSDP2: weights, gradients and
    # optimizer state sharded over the ranks), hsdp (sharded within a node, replicated across)
    strategy: str = setting("ddp", choices=("ddp", "fsdp", "hsdp"))
    fsdp: FSDPConfig = setting(FSDPConfig())
    # recompute activations in the backward, per block: none, full (all of a block's), or
    # selective (keeps matmul and attention outputs, every other matmul recomputed)
    activation_checkpointing: str = setting("none", choices=("none", "full", "selective"))
    # optimizer and loss settings from a step on: [{step: 400, optim: {lr: 0.02}}]; Population
    # Based Training's trials continue with one, and `sweep best` writes the best trial's
    hparam_schedule: list[dict[str, Any]] = setting([])


@dataclass(frozen=True)
class CheckpointConfig:
    """When checkpoints are written, how many are kept, and where training resumes from."""

    every: int = setting(0, min=0)  # optimizer steps between checkpoints; 0 = end of each epoch
    keep: int = setting(2, min=1)  # the newest K; with `monitor`: the best K by it, plus the newest
    monitor: str | None = None  # a validation metric (val/acc): every validation saves, best kept
    mode: str = setting("min", choices=("min", "max"))  # min: lower `monitor` is better
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
    rdzv_timeout: float = setting(120.0, min=1, max=MAX_WAIT_S)  # seconds a rank waits for rank 0
    collective_timeout: float = setting(1800.0, min=1, max=MAX_WAIT_S)
    # preemption and time limits: the signal that asks for checkpoint + requeue
    signal: str = setting("USR2", choices=("USR1", "USR2", "TERM", "INT", "HUP", "URG"))
    max_requeues: int = setting(3, min=0)


@dataclass(frozen=True)
class LocalLauncher(InlineLauncher):
    """N worker processes on this machine through torch's elastic agent."""

    name: str = "local"
    nproc: int = setting(2, min=1)
    max_restarts: int = setting(0, min=0)  # restarts of all workers after one dies


@dataclass(frozen=True)
class SlurmLauncher(InlineLauncher):
    """Submit to Slurm through submitit."""

    name: str = "slurm"
    nodes: int = setting(1, min=1)
    tasks_per_node: int | None = setting(None, min=1)  # null: gpus_per_node, or 1 without GPUs
    gpus_per_node: int = setting(0, min=0)
    cpus_per_task: int | None = setting(None, min=1)
    mem_gb: float | None = setting(None, min=0)
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    timeout_min: int = setting(60, min=1)
    job_name: str | None = None  # null: run.name
    sbatch: dict[str, Any] = setting({})  # any other sbatch option: launcher.sbatch.mail-type=END
    setup: list[str] = setting([])  # shell lines before training (module load ...)
    signal_delay_s: int = setting(90, min=0)  # the signal comes this long before the time limit
    # the code the job imports, copied when submitted (queued jobs run what was submitted):
    # git: the tracked files of your repository; imports: the `imports:` modules' packages;
    # auto: git when your repository holds those modules, else imports; none: the files on disk
    snapshot: str = setting("auto", choices=("auto", "git", "imports", "none"))
    snapshot_max_mb: float = setting(50.0, min=0)  # refuse to submit a larger snapshot


@dataclass(frozen=True)
class LauncherConfig(SlurmLauncher, LocalLauncher):
    """Every launcher key at runtime; a config holds only those of its launcher."""

    name: str = setting("inline", choices=("inline", "local", "slurm"))
    # 1, not LocalLauncher's 2, on purpose: a config holds nproc only with launcher=local; with
    # inline (this one process) or slurm (one process per task) it reads 1
    nproc: int = setting(1, min=1)


LAUNCHERS: dict[str, type] = {
    "inline": InlineLauncher,
    "local": LocalLauncher,
    "slurm": SlurmLauncher,
}


@dataclass(frozen=True)
class PBTConfig:
    """Population Based Training: every `interval` validations, a trial in the bottom
    `quantile` continues from a top trial's checkpoint with perturbed hyperparameters."""

    interval: int = setting(1, min=1)  # validations between exploit/explore rounds of a trial
    quantile: float = setting(0.25, min=0)  # bottom (and top) fraction of the population: (0, 0.5]
    # explore: draw anew instead of perturbing
    resample_probability: float = setting(0.25, min=0, max=1)
    factors: list[float] = setting([0.8, 1.2])  # explore: a float/int value times one of these


@dataclass(frozen=True)
class SweepConfig:
    """How `-m` explores: sampler, objective, early stopping of bad trials, and how many trials
    run side by side on which share of the machine."""

    sampler: str = setting("grid", choices=("grid", "random", "tpe"))
    n_trials: int | None = setting(None, min=1)  # null: every grid point; random/tpe: 10
    metric: str = "val/acc"
    mode: str = setting("max", choices=("max", "min"))
    pruner: str = setting("none", choices=("none", "asha", "median"))
    budget: str = setting("epoch", choices=("epoch", "step"))  # the unit trials report progress in
    grace: int = setting(1, min=1)  # ASHA: budget every trial gets; median: warm-up before pruning
    reduction: int = setting(3, min=2)  # ASHA: keep the top 1/reduction at each rung
    repeat: int = setting(1, min=1)  # seeds per configuration
    seed: int = setting(0, min=0, max=2**32 - 1)  # the sampler's seed (NumPy's range)
    stop_on_failure: bool = False
    # search space: {optim.lr: "tag(log, interval(1e-4, 1e-1))"}
    params: dict[str, str] = setting({})
    # trials at once; null: what the machine holds
    max_concurrent: int | None = setting(None, min=1)
    # a fraction (0.25: four trials per GPU) or N whole GPUs (an N-rank DDP trial); null: 1 GPU
    # where there are GPUs, none on a CPU-only machine
    gpus_per_trial: float | None = setting(None, min=0)
    cpus_per_trial: int | None = setting(None, min=1)  # null: the cores divided evenly
    scheduler: str = setting("none", choices=("none", "pbt"))  # pbt: Population Based Training
    pbt: PBTConfig = setting(PBTConfig())


# how a sweep's driver runs its trials, not what a trial computes: `expctl sweep resume` may
# change them, and a trial rerun by hand may differ in them
SWEEP_DRIVER_KEYS = (
    "sweep.max_concurrent",
    "sweep.gpus_per_trial",
    "sweep.cpus_per_trial",
    "sweep.stop_on_failure",
)


@dataclass(frozen=True)
class ModelConfig:
    """A registered model (or a dict of models) and its constructor arguments."""

    name: str
    args: dict[str, Any] = setting({})


@dataclass(frozen=True)
class DataConfig:
    """A registered dataset, its arguments, and how it is batched."""

    name: str
    batch_size: int = setting(128, min=1)  # per worker; the global batch is batch_size x world size
    val_batch_size: int | None = setting(None, min=1)  # null: batch_size
    # DataLoader workers per rank; null: cores/ranks - 1
    num_workers: int | None = setting(None, min=0)
    pin_memory: Any = setting("auto", choices=("auto", True, False))  # auto: on CUDA
    persistent_workers: bool = True  # ignored: workers are started once and kept for the run
    prefetch_factor: int | None = setting(None, min=1)  # batches each worker reads ahead; null: 2
    timeout: float = setting(300.0, min=1)  # seconds a rank waits for a batch from its workers
    # in-memory data on the GPU
    device_resident: Any = setting("auto", choices=("auto", True, False))
    # on the device, per batch
    augment: str = setting("none", choices=("none", "flip", "crop_flip"))
    args: dict[str, Any] = setting({})


@dataclass(frozen=True)
class OptimConfig:
    """A registered optimizer and its arguments (applied to each model)."""

    name: str
    args: dict[str, Any] = setting({})


@dataclass(frozen=True)
class SchedConfig:
    """An optional LR scheduler, stepped every optimizer `step` or every `epoch`."""

    name: str | None = None
    interval: str = setting("epoch", choices=("epoch", "step"))
    monitor: str | None = None  # a scheduler that steps on a metric (reducelronplateau): which
    args: dict[str, Any] = setting({})


@dataclass(frozen=True)
class LossConfig:
    """A registered loss and its arguments."""

    name: str
    args: dict[str, Any] = setting({})


@dataclass(frozen=True)
class Config:
    """The whole frozen config, as every rank reads it from RUN_DIR/config.yaml."""

    model: ModelConfig
    data: DataConfig
    optim: OptimConfig
    loss: LossConfig
    sched: SchedConfig = setting(SchedConfig())
    train: TrainConfig = setting(TrainConfig())
    checkpoint: CheckpointConfig = setting(CheckpointConfig())
    launcher: LauncherConfig = setting(LauncherConfig())
    run: RunConfig = setting(RunConfig())
    sweep: SweepConfig = setting(SweepConfig())
    imports: list[str] = setting([])  # your modules, imported in every process before building
    logger: dict[str, dict[str, Any]] = setting(
        {}
    )  # loggers (expctl/builtin/loggers.py) -> their arguments
    env: dict[str, str] = setting({})  # environment variables set in every worker
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
            *parents, leaf = key_path(path)
            set_leaf(lookup(out, parents), leaf, text)
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


HPARAM_SECTIONS = ("optim", "loss")  # what can change mid-run: param groups, loss settings


def monitors(cfg: Config) -> dict[str, str]:
    """The metrics the run acts on, by the key that names each: best checkpoints, early
    stopping, a scheduler that steps on a metric."""
    named = {
        "checkpoint.monitor": cfg.checkpoint.monitor,
        "train.early_stop.monitor": cfg.train.early_stop.monitor,
        "sched.monitor": cfg.sched.monitor,
    }
    return {k: v for k, v in named.items() if v is not None}


def lookup(tree: Any, path: list[str | int]) -> Any:
    """The value at a path of keys and list indexes in nested dicts and lists, or None."""
    for part in path:
        if isinstance(tree, dict) and isinstance(part, str):
            tree = tree.get(part)
        elif isinstance(tree, list) and isinstance(part, int) and part < len(tree):
            tree = tree[part]
        else:
            return None
    return tree


def set_leaf(node: Any, leaf: str | int, value: Any) -> None:
    in_dict = isinstance(node, dict) and isinstance(leaf, str) and leaf in node
    in_list = isinstance(node, list) and isinstance(leaf, int) and leaf < len(node)
    if in_dict or in_list:
        node[leaf] = value


def key_path(dotted: str) -> list[str | int]:
    """'launcher.setup[1]' -> ['launcher', 'setup', 1]."""
    out: list[str | int] = []
    for part in dotted.split("."):
        name, *indexes = part.split("[")
        out += [name] + [int(i.rstrip("]")) for i in indexes]
    return out
