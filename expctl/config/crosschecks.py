"""Cross-section checks of a validated `Config`: the paths and names it writes under, the files
its keys name (`checkpoint.resume`, `checkpoint.init`), the monitored metrics, and train.strategy
against the ranks the launcher starts (`check_layout`, also run by an inline launch). Called by
`validate.py`, every time a config is used.
"""

from __future__ import annotations

from pathlib import Path

from expctl.config.components import check_hparam_schedule
from expctl.config.schema import CheckpointConfig, Config, TrainConfig, monitors
from expctl.config.values import check_name, check_path_length, check_slurm, plain_text
from expctl.errors import UserError

# the built-in steps that scale and hold back each micro-batch's update (StepContext does)
ACCUMULATING_STEPS = ("supervised", "lm")


def cross_checks(cfg: Config) -> None:
    """The checks across sections, and of the files the config names (on every use of a
    config: `validate`, `recheck`).

    Raises:
        UserError: naming the first setting that cannot be.
    """
    train_cfg = cfg.train
    for key in ("dir", "root"):
        plain_text(f"run.{key}", getattr(cfg.run, key))
    # room for root/NAME-YYYYmmdd-HHMMSS-xxxx/ and the deepest file a run writes inside (W&B's)
    check_path_length("run.root", cfg.run.root, inside=len(cfg.run.name) + 300)
    check_path_length("run.dir", cfg.run.dir, inside=300)
    plain_text("checkpoint.resume", cfg.checkpoint.resume)
    check_name("run.name", cfg.run.name)
    if cfg.launcher.name == "slurm":
        check_slurm(cfg)
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "never") and not Path(resume).expanduser().exists():
        raise UserError(
            f"checkpoint.resume: no checkpoint at '{resume}'",
            "use auto (latest in the run directory), never, or the path of a checkpoint (a .pt "
            "file, or a .dcp folder of shards)",
        )
    _check_init(cfg.checkpoint)
    for where, name in monitors(cfg).items():
        if not name.startswith("val/"):
            raise UserError(
                f"{where}={name}: only validation metrics (val/...) can be monitored",
                f"e.g. {where}=val/loss or {where}=val/acc",
            )
    if train_cfg.compile_mode != "default" and not train_cfg.compile:
        raise UserError(
            f"train.compile_mode={train_cfg.compile_mode} does nothing without train.compile=true",
            "add train.compile=true, or drop train.compile_mode",
        )
    check_hparam_schedule(cfg)
    _check_strategy(cfg)
    if train_cfg.grad_accum > 1 and train_cfg.step not in ACCUMULATING_STEPS:
        raise UserError(
            f"train.grad_accum={train_cfg.grad_accum} is handled by the "
            f"{' and '.join(ACCUMULATING_STEPS)} steps only (train.step={train_cfg.step})",
            "set train.grad_accum=1, or accumulate inside your own batch step",
        )


def _check_strategy(cfg: Config) -> None:
    """train.strategy against the rest of the config, and against the ranks the launcher
    starts where the config says how many (launcher=local and slurm)."""
    train_cfg, launcher = cfg.train, cfg.launcher
    if train_cfg.strategy != "hsdp" and train_cfg.fsdp.shard_size is not None:
        raise UserError(
            f"train.fsdp.shard_size={train_cfg.fsdp.shard_size} is for train.strategy=hsdp (this "
            f"config says {train_cfg.strategy})",
            "drop train.fsdp.shard_size, or set train.strategy=hsdp",
        )
    if train_cfg.strategy != "ddp" and cfg.sweep.scheduler == "pbt":
        raise UserError(
            f"sweep.scheduler=pbt copies checkpoints between trials, which it does for "
            f"train.strategy=ddp only (this config says {train_cfg.strategy})",
            "use train.strategy=ddp for PBT sweeps, or sweep.scheduler=none",
        )
    if launcher.name == "local":
        check_layout(train_cfg, 1, launcher.nproc, "launcher=local")
    elif launcher.name == "slurm":
        per_node = launcher.tasks_per_node or launcher.gpus_per_node or 1
        where = f"launcher.nodes={launcher.nodes}"
        check_layout(train_cfg, launcher.nodes, launcher.nodes * per_node, where)


def check_layout(train_cfg: TrainConfig, nodes: int, ranks: int, where: str) -> None:
    """train.strategy=hsdp against the ranks of a run: more than one node, and shard groups
    that divide the ranks (`where` says where the layout comes from).

    Raises:
        UserError: hsdp on one node, or a shard group size that does not divide the ranks.
    """
    if train_cfg.strategy != "hsdp":
        return
    if nodes < 2:
        raise UserError(
            f"train.strategy=hsdp shards within a node and replicates across nodes, but this "
            f"run has one node ({where})",
            "use train.strategy=fsdp on one node, or run on several (launcher=slurm "
            "launcher.nodes=2)",
        )
    size = train_cfg.fsdp.shard_size or ranks // nodes
    if ranks % nodes or ranks % size or size > ranks:
        divisors = [d for d in range(1, ranks + 1) if ranks % d == 0]
        raise UserError(
            f"train.strategy=hsdp: shard groups of {size} rank(s) do not divide the {ranks} "
            f"ranks of {nodes} nodes ({where})",
            f"set train.fsdp.shard_size to one of {', '.join(map(str, divisors))}",
        )


def _check_init(ckpt_cfg: CheckpointConfig) -> None:
    plain_text("checkpoint.init", ckpt_cfg.init)
    if ckpt_cfg.init is None:
        return
    if not Path(ckpt_cfg.init).expanduser().exists():
        raise UserError(
            f"checkpoint.init: nothing at '{ckpt_cfg.init}'",
            "give an expctl checkpoint (.pt), a file saved with torch.save(model.state_dict()), "
            "or a run directory (its best checkpoint, else its newest)",
        )
    if ckpt_cfg.resume not in ("auto", "never"):
        raise UserError(
            f"checkpoint.init={ckpt_cfg.init} and checkpoint.resume={ckpt_cfg.resume}: pick one",
            "init starts from weights only (a new optimizer, step 0); resume restores all of it",
        )
