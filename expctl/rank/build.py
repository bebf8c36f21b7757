"""Assemble the training parts from the frozen config: registries -> data, models (DDP),
optimizers, schedulers, loss and step. Runtime objects never copy config keys."""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from expctl import registry
from expctl.builtin.data import Splits, check_splits
from expctl.builtin.reader import Loading, Reader
from expctl.builtin.steps import StepContext
from expctl.config.schema import Config
from expctl.dist import CUDNN_BENCHMARK_ENV, DistEnv, check_sync_batchnorm, usable_cores
from expctl.errors import UserError
from expctl.rank import strategy
from expctl.rank.batches import TrainBatches, auto_workers
from expctl.startup import freeze_for_this_run, paused_gc

log = logging.getLogger("expctl")


@dataclass
class Parts:
    """Everything the loop needs, built identically on every rank."""

    models: dict[str, nn.Module]  # unwrapped by DDP (sharded in place by FSDP): what is saved
    ctx: StepContext  # holds the DDP-wrapped / compiled models the batch step calls
    schedulers: dict[str, Any]
    batch_step: Any  # the train.step component: what one batch does (train_step, val_step)
    splits: Splits
    batches: TrainBatches
    total_steps: int  # optimizer steps of the whole run
    model_args: dict[str, Any]  # what the model factory got, data-inferred values included
    sched_interval: str  # when the schedulers step: each "epoch" or each "step"
    sched_monitor: str | None = None  # ... or after each validation, on this metric
    sched_length: int | None = None  # the run's length the schedule was built for, if it was
    val_batch_size: int = 256  # batch size of validation and test
    limit_val_batches: int | None = None  # validations: this many batches per rank (debug runs)
    reader: Reader | None = None  # the DataLoader workers of the streamed splits
    # train.strategy=fsdp/hsdp: checkpoints in torch.distributed.checkpoint's format (every rank
    # writes its shard), and every rank calls the models as often as the others (validation)
    sharded: bool = False

    def trained_on(self) -> dict[str, Any]:
        """What a checkpoint keeps of the data (`restore.check_data`): the training split's size
        and the classes' names."""
        classes = self.splits.info.classes
        return {"train_samples": len(self.splits.train), "classes": list(classes or []) or None}  # type: ignore[arg-type]

    def close(self) -> None:
        """End the stream of training batches and the DataLoader workers."""
        self.batches.close()
        if self.reader is not None:
            self.reader.close()


def pick_device(cfg: Config, env: DistEnv) -> torch.device:
    """cuda:LOCAL_RANK when CUDA is asked for (or auto and present), else cpu."""
    want = cfg.train.device
    _cpu_threads(env)
    if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(
            "train.device=cuda but no CUDA device is visible", "use train.device=auto or cpu"
        )
    device = torch.device("cuda", env.local_rank % max(1, torch.cuda.device_count()))
    torch.cuda.set_device(device)
    _cuda_defaults()
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is bf16 autocast on a CUDA device that supports it, fp32 elsewhere."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "32"


def _cuda_defaults() -> None:
    """Fast defaults on CUDA: cuDNN picks the fastest kernels for our fixed shapes (unless
    EXPCTL_CUDNN_BENCHMARK=0: a GPU shared with other trials); fp32 matmuls and convolutions may
    use TF32 (what autocast-free fp32 runs would otherwise lose)."""
    torch.backends.cudnn.benchmark = os.environ.get(CUDNN_BENCHMARK_ENV, "1") != "0"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def _cpu_threads(env: DistEnv) -> None:
    """Split the cores this process may use (its affinity: a sweep trial's share) between the
    ranks of this node, unless OMP_NUM_THREADS says otherwise (torchrun sets it to 1; torch's
    agent, which `launcher=local` uses, sets nothing). On GPUs too: each rank's intra-op pool
    would otherwise start a thread per core, N ranks x all cores (the raw loop under torchrun ran
    one per rank beside expctl's 64 on 4 x H200); a trial pinned to 2 of 64 cores, 64 threads."""
    cores = usable_cores()
    narrowed = cores < (os.cpu_count() or cores)
    if (env.local_world_size > 1 or narrowed) and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, cores // env.local_world_size))


def build(cfg: Config, env: DistEnv, device: torch.device, training: bool = True) -> Parts:
    """Build data, models, optimizers, schedulers, loss and step for this rank; not `training`
    (`expctl eval`), a training split without a full batch, or without train.grad_accum of them,
    is no error: no training batch is taken."""
    registry.import_user_modules(cfg.imports)
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    splits = _splits(cfg, device)
    loading = _loading(cfg, env, device, splits)
    reader = _reader(splits, loading, cfg.train.seed, env.rank)
    try:
        return _build(cfg, env, device, splits, loading, reader, training)
    except BaseException:
        if reader is not None:
            reader.close()
        raise


def _reader(splits: Splits, loading: Loading, seed: int, rank: int) -> Reader | None:
    """The DataLoader workers of the streamed splits, forked now: no thread of this process
    runs yet (see reader.py), and the model is not yet in memory to be copied."""
    streamed = {
        name: ds
        for name in ("train", "val", "test")
        if (ds := getattr(splits, name)) is not None and not isinstance(ds, TensorDataset)
    }
    if not streamed:
        return None
    reader = Reader(streamed, loading, seed, rank)
    reader.start()
    return reader


def _build(
    cfg: Config,
    env: DistEnv,
    device: torch.device,
    splits: Splits,
    loading: Loading,
    reader: Reader | None,
    training: bool = True,
) -> Parts:
    models, model_args = _models(cfg, splits)
    if cfg.train.sync_batchnorm and env.distributed:
        models = _sync_batchnorm(models, env, device)
    elif cfg.train.sync_batchnorm:
        log.info("train.sync_batchnorm: one rank, so BatchNorm is left as it is")
    strategy.place(models, device)
    channels_last = _channels_last(cfg, models, device)
    if channels_last:
        for m in models.values():
            m.to(memory_format=torch.channels_last)
    resident = cfg.data.device_resident is True or (
        cfg.data.device_resident == "auto" and device.type == "cuda"
    )
    batches = TrainBatches(
        splits.train,
        cfg.data.batch_size,
        env.rank,
        env.world_size,
        cfg.train.seed,
        device,
        loading=loading,
        resident=resident,
        augment=cfg.data.augment,
        reader=reader,
        training=training,
    )
    per_worker = batches.steps_per_epoch  # evaluating: at least one accumulation, for the shapes
    total_steps = _total_steps(
        cfg, per_worker if training else max(per_worker, cfg.train.grad_accum)
    )
    precision = resolve_precision(cfg.train.precision, device)
    strategy.prepare(cfg, models, env, device, precision)  # sharded before the optimizers
    with paused_gc(freeze=freeze_for_this_run(env.distributed)):  # it imports torch._dynamo
        optimizers = {k: _optimizer(cfg, m, device) for k, m in models.items()}
    per_epoch = max(1, batches.steps_per_epoch // cfg.train.grad_accum)
    epochs = cfg.train.max_epochs or -(-total_steps // per_epoch)  # max_steps alone: as it takes
    schedulers, sched_length = _schedulers(cfg, optimizers, total_steps, epochs)
    loss_fn = _make(
        "loss", cfg.loss.name, registry.get("losses", cfg.loss.name).factory, **cfg.loss.args
    )
    loss_fn = loss_fn.to(device)
    wrapped = {k: strategy.wrap(cfg, m, env, device) for k, m in models.items()}
    amp = strategy.autocast_dtype(cfg.train, env, precision)
    scaler = strategy.grad_scaler(cfg.train, env, device) if precision == "16" else None
    ctx = StepContext(
        models=wrapped,
        optimizers=optimizers,
        loss_fn=loss_fn,
        device=device,
        amp_dtype=amp,
        scaler=scaler,
        grad_accum=cfg.train.grad_accum,
        grad_clip=cfg.train.grad_clip,
        channels_last=channels_last,
        skip_nonfinite=cfg.train.on_nan == "skip",
    )
    torch.manual_seed(cfg.train.seed + env.rank)  # dropout & co differ per rank
    batch_step = registry.get("steps", cfg.train.step).factory()
    missing = [m for m in getattr(batch_step, "requires", ()) if m not in models]
    if missing:
        raise UserError(
            f"train.step={cfg.train.step} trains models {', '.join(batch_step.requires)}, but model "
            f"'{cfg.model.name}' gives {', '.join(models)}",
            "pick a model that gives them (e.g. model=dcgan for train.step=gan)",
        )
    return Parts(
        models,
        ctx,
        schedulers,
        batch_step,
        splits,
        batches,
        total_steps,
        model_args,
        sched_interval=cfg.sched.interval,
        sched_monitor=cfg.sched.monitor,
        sched_length=sched_length,
        val_batch_size=cfg.data.val_batch_size or cfg.data.batch_size,
        limit_val_batches=cfg.train.limit_val_batches,
        reader=reader,
        sharded=cfg.train.strategy != "ddp",
    )


def _splits(cfg: Config, device: torch.device) -> Splits:
    """The dataset's splits, as its factory returns them (checked against the contract)."""
    entry = registry.get("datasets", cfg.data.name)
    runtime = {"device": device} if "device" in entry.runtime else {}
    made = _make("data", cfg.data.name, entry.factory, **cfg.data.args, **runtime)
    return check_splits(cfg.data.name, made)


def _loading(cfg: Config, env: DistEnv, device: torch.device, splits: Splits) -> Loading:
    data_cfg = cfg.data
    workers = data_cfg.num_workers
    if workers is None:
        workers = auto_workers(env.local_world_size)
    pin = data_cfg.pin_memory if data_cfg.pin_memory != "auto" else device.type == "cuda"
    pin = pin and getattr(splits.train, "pin_memory", True)  # e.g. not lists of encoded files
    if not data_cfg.persistent_workers and env.is_main:
        log.warning(
            "data.persistent_workers=false is ignored: a rank's DataLoader workers are started "
            "once and kept for the run (forking them later, while threads run, can hang)"
        )
    return Loading(workers, bool(pin), data_cfg.prefetch_factor, data_cfg.timeout)


def _make(section: str, name: str, factory: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a registered factory; a value it rejects is the config's fault, not a crash."""
    try:
        return factory(*args, **kwargs)
    except UserError:
        raise
    except (ValueError, TypeError, RuntimeError, IndexError, KeyError) as e:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        text = " ".join(str(e).split())[:200]
        raise UserError(
            f"{section} '{name}' rejected its arguments ({shown}): {text}",
            f"fix the {section}.* values; `expctl list` shows what '{name}' takes",
        ) from None


def _models(cfg: Config, splits: Splits) -> tuple[dict[str, nn.Module], dict[str, Any]]:
    entry = registry.get("models", cfg.model.name)
    args = dict(cfg.model.args)
    params = entry.parameters()
    info = splits.info
    inferred = {
        "in_channels": info.input_shape[0] if info.input_shape else None,
        "input_shape": tuple(info.input_shape),
        "num_classes": info.num_classes,
        "vocab_size": info.num_classes,  # a language model's classes: its next-token choices
        "block_size": info.input_shape[0] if len(info.input_shape) == 1 else None,
    }
    _check_input_kind(cfg, entry.inferred, tuple(info.input_shape))
    for key in entry.inferred:  # null (or absent): from the data, else the factory's default
        if args.get(key) is None and key in params and inferred.get(key) is not None:
            args[key] = inferred[key]
        elif args.get(key) is None:
            args.pop(key, None)
    built = strategy.construct(
        cfg.train, lambda: _make("model", cfg.model.name, entry.factory, **args)
    )
    models = built if isinstance(built, dict) else {"model": built}
    for name, m in models.items():
        if not isinstance(m, nn.Module):
            raise UserError(
                f"model={cfg.model.name}: the model factory returned {type(m).__name__} for "
                f"'{name}', not a torch.nn.Module",
                "a model factory returns its nn.Module (or {name: nn.Module} for several models)",
            )
        _check_image_size(cfg.model.name, m, info.input_shape)
    return models, args


def _check_input_kind(cfg: Config, inferred: Any, shape: tuple[int, ...]) -> None:
    """A model (by what it infers from the data) or train.step=lm and data of another kind:
    token windows for image models, images for language models. Said before training, not as
    torch's error deep in the first forward.

    Raises:
        UserError: the model, or the step, and what the data gives.
    """
    gives = f"data={cfg.data.name} gives samples of shape {list(shape)}"
    if ("block_size" in inferred or cfg.train.step == "lm") and len(shape) != 1:
        who = f"model={cfg.model.name}" if "block_size" in inferred else "train.step=lm"
        raise UserError(
            f"{who} takes windows of token ids (data=tokens); {gives}",
            "for language models use data=tokens (experiment=gpt_tiny); for this data, a model "
            "of its kind (model=resnet18, cnn, mlp) and train.step=supervised",
        )
    if "in_channels" in inferred and len(shape) != 3:
        kind = "windows of token ids" if cfg.train.step == "lm" else "no images"
        raise UserError(
            f"model={cfg.model.name} takes images (channels, height, width); {gives} ({kind})",
            "pick a model for this data: model=gpt for data=tokens, model=mlp for vectors",
        )


def _check_image_size(name: str, model: nn.Module, shape: tuple[int, ...]) -> None:
    """A model built for one image size (torchvision's ViT: `image_size`) and data of another:
    said before training, not as an assertion deep in its first forward."""
    size = getattr(model, "image_size", None)
    if not isinstance(size, int) or len(shape) != 3 or tuple(shape[1:]) == (size, size):
        return
    raise UserError(
        f"model={name} takes {size} x {size} images; the data gives {shape[1]} x {shape[2]}",
        f"give it {size} x {size} images (data=image_folder data.image_size={size}), or pick a "
        "model that takes any size (e.g. model=resnet18)",
    )


def _sync_batchnorm(
    models: dict[str, nn.Module], env: DistEnv, device: torch.device
) -> dict[str, nn.Module]:
    """train.sync_batchnorm: BatchNorm layers normalise with the statistics of the global batch."""
    check_sync_batchnorm(env.world_size, device.type)
    converted = {k: nn.SyncBatchNorm.convert_sync_batchnorm(m) for k, m in models.items()}
    layers = sum(isinstance(x, nn.SyncBatchNorm) for m in converted.values() for x in m.modules())
    log.info(
        "train.sync_batchnorm: %d BatchNorm layer(s) use the statistics of all %d ranks",
        layers,
        env.world_size,
    )
    return converted


def _channels_last(cfg: Config, models: dict[str, nn.Module], device: torch.device) -> bool:
    if cfg.train.channels_last != "auto":
        return bool(cfg.train.channels_last)
    has_conv = any(isinstance(x, nn.Conv2d) for m in models.values() for x in m.modules())
    return device.type == "cuda" and has_conv


def _total_steps(cfg: Config, steps_per_epoch: int) -> int:
    if steps_per_epoch < cfg.train.grad_accum:
        raise UserError(
            f"train.grad_accum={cfg.train.grad_accum} needs {cfg.train.grad_accum} batches per "
            f"epoch on each worker, but the data gives {steps_per_epoch}",
            "lower train.grad_accum or data.batch_size, or use more data",
        )
    per_epoch = max(1, steps_per_epoch // cfg.train.grad_accum)
    train_cfg = cfg.train
    by_epochs = per_epoch * train_cfg.max_epochs if train_cfg.max_epochs is not None else None
    limits = [n for n in (by_epochs, train_cfg.max_steps) if n is not None]  # one at least
    return min(limits)


def _optimizer(cfg: Config, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    entry = registry.get("optimizers", cfg.optim.name)
    args = dict(cfg.optim.args)
    accepted = inspect.signature(entry.factory).parameters
    if (
        device.type == "cuda"
        and "fused" in accepted
        and args.get("fused") is None
        and args.get("foreach") is None
    ):
        args["fused"] = True  # one kernel for the whole update
    opt: torch.optim.Optimizer = _make(
        "optim", cfg.optim.name, entry.factory, model.parameters(), **args
    )
    probe = [torch.zeros(1, device=device, requires_grad=True)]
    for i, later in enumerate(cfg.train.hparam_schedule):  # values it would reject mid-run
        if later.get("optim"):
            where = f"train.hparam_schedule[{i}].optim"
            _make(where, cfg.optim.name, entry.factory, probe, **{**args, **later["optim"]})
    return opt


def _schedulers(
    cfg: Config, optimizers: dict[str, torch.optim.Optimizer], total_steps: int, epochs: int
) -> tuple[dict[str, Any], int | None]:
    """The schedulers, and the run's length they were built for (None: they do not know it)."""
    if cfg.sched.name is None:
        return {}, None
    entry = registry.get("schedulers", cfg.sched.name)
    args = dict(cfg.sched.args)
    length = total_steps if cfg.sched.interval == "step" else epochs
    inferred = [k for k in ("total_steps", "T_max") if k in entry.inferred and args.get(k) is None]
    for key in inferred:  # the run's length, in the unit of sched.interval
        args[key] = length
    made = {
        k: _make("sched", str(cfg.sched.name), entry.factory, opt, **args)
        for k, opt in optimizers.items()
    }
    return made, length if inferred else None
