"""How the ranks hold the models (train.strategy), chosen once when the parts are built: `ddp`,
a whole copy on every rank (DistributedDataParallel), or FSDP2's `fully_shard` on each block a
model declares and then on the model, so that weights, gradients and optimizer state are split
over the ranks (`fsdp`; `hsdp`: split within a node, replicated across nodes). Activation
checkpointing applies per block under every strategy. The loop calls what this builds and
never asks which strategy it was."""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from expctl.config.schema import Config, TrainConfig
from expctl.dist import DistEnv
from expctl.errors import UserError

log = logging.getLogger("expctl")

_LOW = {"bf16": torch.bfloat16, "16": torch.float16}
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)

# blocks of model families that do not name theirs (`blocks`): torchvision's ResNet stages and
# ViT encoder blocks, as dotted paths of a container whose children are the blocks, or of blocks
_FAMILIES: tuple[tuple[str, ...], ...] = (
    ("layer1", "layer2", "layer3", "layer4"),
    ("encoder.layers",),
)


def sharded(train_cfg: TrainConfig, env: DistEnv) -> bool:
    """Whether this run's models are split over its ranks (fsdp or hsdp on several ranks; one
    rank holds the whole model, as under ddp)."""
    return train_cfg.strategy != "ddp" and env.distributed


def blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of a model, each sharded (and checkpointed) on its own: the model's `blocks`
    attribute (a ModuleList, ModuleDict or Sequential), else its family's (ResNet's stages,
    ViT's encoder layers); none when neither names them."""
    declared = getattr(model, "blocks", None)
    if isinstance(declared, nn.ModuleDict):
        return list(declared.values())
    if isinstance(declared, (nn.ModuleList, nn.Sequential)):
        return list(declared)
    for paths in _FAMILIES:
        found = [_submodule(model, p) for p in paths]
        if all(isinstance(f, nn.Module) for f in found):
            if len(found) == 1 and isinstance(found[0], (nn.Sequential, nn.ModuleList)):
                return list(found[0])
            return [f for f in found if f is not None]
    return []


def _submodule(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def construct(train_cfg: TrainConfig, make: Callable[[], Any]) -> Any:
    """What the model factory `make` gives: under fsdp and hsdp built on the meta device when
    every model it gives can make its weights later (`init_weights()`, as torchtitan's models
    and model=gpt do), so that no rank holds the whole model before it is sharded; else (and
    under ddp) built as usual."""
    if train_cfg.strategy == "ddp":
        return make()
    try:
        with torch.device("meta"):
            built = make()
    except Exception:  # what cannot be built without memory is built with it
        return make()
    models = built.values() if isinstance(built, dict) else [built]
    if all(isinstance(m, nn.Module) and _on_meta(m) and _initialises(m) for m in models):
        return built
    return make()


def _initialises(model: nn.Module) -> bool:
    return callable(getattr(model, "init_weights", None))


def prepare(
    cfg: Config, models: dict[str, nn.Module], env: DistEnv, device: torch.device, precision: str
) -> None:
    """Before the optimizers are made, in place: activation checkpointing per block, each
    block's forward compiled (fsdp, hsdp, where train.compile asks), FSDP2 on each block then
    the model (fsdp, hsdp on several ranks; `precision` resolved: 32, bf16 or 16), and a model
    built on the meta device made and initialised where its weights now live (its
    `init_weights()`)."""
    train_cfg = cfg.train
    mesh = _mesh(train_cfg, env, device) if sharded(train_cfg, env) else None
    if mesh is not None:
        log.info(
            "train.strategy=%s: mesh %s",
            train_cfg.strategy,
            dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)),
        )
    for name, m in models.items():
        units, ac = blocks(m), train_cfg.activation_checkpointing != "none"
        shards = mesh is not None
        doing = " and ".join(w for w, on in (("sharded", shards), ("checkpointed", ac)) if on)
        if doing and not units:
            log.info("model '%s' names no blocks: it is %s as one unit", name, doing)
        if ac:
            for unit in units or [m]:
                _checkpoint_forward(unit, train_cfg.activation_checkpointing)
        if train_cfg.strategy != "ddp":
            _check_shardable(cfg.model.name, name, m)
        if device.type != "cuda":  # DTensor's random ops on CPU would repeat one shard's values
            materialise(cfg.model.name, name, m, device, train_cfg.seed)
        if train_cfg.compile and train_cfg.strategy != "ddp":  # per block (torchtitan's way):
            for unit in units or [m]:  # FSDP's hooks outside the graphs, on any number of ranks
                unit.forward = torch.compile(unit.forward, mode=train_cfg.compile_mode)
        if mesh is not None:
            _fully_shard(train_cfg, m, units, mesh, _LOW.get(precision))
    for name, m in models.items():  # on CUDA each rank makes its shards alone
        materialise(cfg.model.name, name, m, device, train_cfg.seed)


def place(models: dict[str, nn.Module], device: torch.device) -> None:
    """Move the models to `device`, except those built on the meta device (made after
    sharding, where their shards live)."""
    for m in models.values():
        if not _on_meta(m):
            m.to(device)


def _on_meta(model: nn.Module) -> bool:
    return any(x.is_meta for x in itertools.chain(model.parameters(), model.buffers()))


def materialise(model_name: str, name: str, model: nn.Module, device: Any, seed: int) -> None:
    """A model built on the meta device (shapes only, as torchtitan builds a large one), given
    memory on `device` (its shards', when sharded) and values by its `init_weights()`, which
    also computes buffers no state dict holds (rotary tables); any other model is left alone.

    Raises:
        UserError: the model has no init_weights().
    """
    if not _on_meta(model):
        return
    if not _initialises(model):
        raise UserError(
            f"model={model_name}: '{name}' is built on the meta device but has no "
            "init_weights() to give its weights values",
            "give the model an init_weights() method, or build it on the CPU",
        )
    log.info("model '%s': built on the meta device, made on %s by its init_weights()", name, device)
    model.to_empty(device=device)
    torch.manual_seed(seed)  # the same weights whatever the ranks
    with torch.no_grad():
        model.init_weights()  # type: ignore[operator]


def _check_shardable(model: str, name: str, m: nn.Module) -> None:
    """FSDP2 splits every parameter along its first dimension: a scalar has none, and a lazy
    layer's parameter has no shape until its first forward.

    Raises:
        UserError: such a parameter, named.
    """
    for pname, p in m.named_parameters():
        if nn.parameter.is_lazy(p):
            raise UserError(
                f"model={model}: parameter '{pname}' of '{name}' has no shape before the first "
                "forward (a lazy layer): FSDP cannot shard it",
                "give the layer its input size (nn.Linear for nn.LazyLinear), or use "
                "train.strategy=ddp",
            )
        if p.dim() == 0:
            raise UserError(
                f"model={model}: parameter '{pname}' of '{name}' is a scalar: FSDP shards "
                "tensors of one dimension or more",
                "make it a 1-element tensor (nn.Parameter(torch.ones(1))), or use "
                "train.strategy=ddp",
            )


def _mesh(train_cfg: TrainConfig, env: DistEnv, device: torch.device) -> DeviceMesh:
    """fsdp: one dimension over every rank; hsdp: (replicas, shard group), the shard groups
    of `train.fsdp.shard_size` ranks, those of one node by default (config/crosschecks.py
    `check_layout` made sure they divide the ranks)."""
    if train_cfg.strategy == "fsdp":
        return init_device_mesh(device.type, (env.world_size,), mesh_dim_names=("shard",))
    size = train_cfg.fsdp.shard_size or env.local_world_size
    return init_device_mesh(
        device.type, (env.world_size // size, size), mesh_dim_names=("replicate", "shard")
    )


def _fully_shard(
    train_cfg: TrainConfig, model: nn.Module, units: list[nn.Module], mesh: DeviceMesh, low: Any
) -> None:
    """Each block, then the model (the parameters outside the blocks), as torchtitan does; in
    bf16/fp16 (`low`), the weights are gathered in it and the gradients reduced in fp32 (fp32:
    no policy). The model's outputs come back in fp32, so the loss is computed in it."""
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
    if low is not None:  # BatchNorm in fp32, as autocast runs it: its statistics are fp32
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=low)
        for norm in (x for x in model.modules() if isinstance(x, _BATCHNORMS)):
            fully_shard(norm, mesh=mesh, mp_policy=fp32, reshard_after_forward=False)
    for unit in units:
        fully_shard(
            unit,
            mesh=mesh,
            mp_policy=policy,
            reshard_after_forward=train_cfg.fsdp.reshard_after_forward,
        )
    root = MixedPrecisionPolicy(
        param_dtype=low,
        reduce_dtype=policy.reduce_dtype,
        output_dtype=torch.float32 if low else None,
    )
    fully_shard(model, mesh=mesh, mp_policy=root)  # the root keeps its weights for the backward


def grad_scaler(train_cfg: TrainConfig, env: DistEnv, device: torch.device) -> Any:
    """fp16's loss scaler: sharded gradients need every rank's verdict on inf/NaN (the sharded
    scaler all-reduces it), else a rank could skip a step the others take."""
    if sharded(train_cfg, env):
        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)


def autocast_dtype(train_cfg: TrainConfig, env: DistEnv, precision: str) -> torch.dtype | None:
    """The dtype the step autocasts to: none where FSDP's policy casts the weights."""
    return None if sharded(train_cfg, env) else _LOW.get(precision)


# ---------------------------------------------------------------------------------------------
# activation checkpointing
# ---------------------------------------------------------------------------------------------


def _checkpoint_forward(block: nn.Module, mode: str) -> None:
    """Recompute `block`'s activations in the backward (torch.utils.checkpoint, non-reentrant).
    The forward is replaced on the instance rather than wrapped in another module, so that
    parameter names, and with them checkpoints, stay those of the model without it."""
    inner = block.forward
    # two functions: the full one passes no context_fn, since torch.compile cannot trace a
    # checkpoint given torch's noop_context_fn through a variable (InternalTorchDynamoError)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    def selective(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, context_fn=_selective, **kwargs)

    if mode == "selective":
        forward = selective
    block.forward = forward


def _saved_ops() -> set[Any]:
    """The ops whose outputs selective checkpointing keeps: matmuls, convolutions, attention
    (costly to recompute, as torchtitan's list); those this torch has."""
    names = [
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    aten = torch.ops.aten
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


_MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


def _selective() -> Any:
    """Op-level selective checkpointing (torchtitan's policy): keep the outputs of costly ops,
    except every second matmul; recompute everything else. The forward and its recompute count
    matmuls apart, so both decide alike."""
    saved, counts = _saved_ops(), {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func not in saved:
            return CheckpointPolicy.PREFER_RECOMPUTE
        if func.overloadpacket.__name__ in _MATMULS:
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE

    return create_selective_checkpoint_contexts(policy)


# ---------------------------------------------------------------------------------------------
# after the optimizers: DDP, torch.compile
# ---------------------------------------------------------------------------------------------


def _batchnorm_buffers_only(model: nn.Module) -> bool:
    """Whether every buffer is a BatchNorm running statistic. DDP's default broadcasts rank 0's
    buffers before every forward (one collective per step); a training forward never reads these
    (BatchNorm normalises by the batch), rank 0's evolve the same either way, and the loop gives
    every rank rank 0's before it validates or saves (`sync_buffers`): so the broadcast is
    skipped. Any other buffer may be read by the forward, and keeps DDP's default."""
    owners = {name.rpartition(".")[0] for name, _ in model.named_buffers(remove_duplicate=False)}
    modules = dict(model.named_modules(remove_duplicate=False))
    return all(isinstance(modules.get(o), _BATCHNORMS) for o in owners)


def wrap(cfg: Config, model: nn.Module, env: DistEnv, device: torch.device) -> nn.Module:
    """What the step calls: the model in DDP (ddp, several ranks; a sharded model is its own
    wrapper), compiled when train.compile asks (under fsdp and hsdp its blocks were compiled one
    by one in `prepare`, before sharding)."""
    out: nn.Module = model
    trains = any(p.requires_grad for p in model.parameters())
    if cfg.train.strategy == "ddp" and env.distributed and trains:
        sync = not _batchnorm_buffers_only(model)
        # torch >= 2.13 names it forward_sync_buffers (buffers still synced once at init);
        # broadcast_buffers, its older name, is deprecated there
        newer = "forward_sync_buffers" in inspect.signature(DDP).parameters
        flag: dict[str, Any] = {"forward_sync_buffers" if newer else "broadcast_buffers": sync}
        out = DDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
            **flag,
        )
    if cfg.train.compile and cfg.train.strategy == "ddp":
        out = torch.compile(out, mode=cfg.train.compile_mode)  # type: ignore[assignment]
    return out
