"""Where a rank's training starts from: this run's newest checkpoint, the checkpoint.resume=PATH
it started from, checkpoint.init's weights, or the beginning (`restore`); and model weights
alone from an expctl checkpoint, a run directory or a plain state-dict file (`load_weights`,
`put_weights`: checkpoint.init and `expctl eval`)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from expctl.config.schema import Config
from expctl.dist import DistEnv
from expctl.errors import UserError
from expctl.rank import checkpoint, sharded
from expctl.rank.build import Parts
from expctl.rank.loopstate import TrainState

log = logging.getLogger("expctl")


def restore(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, run_dir: Path
) -> int | None:
    """Set `state` to where training continues: this run's newest checkpoint (resume=auto,
    or any restart within the launch), else the checkpoint.resume=PATH it started from, else
    the beginning.

    Returns:
        How many metrics.jsonl rows precede that point (None: a checkpoint without the count).
    """
    resume = cfg.checkpoint.resume
    own = resume == "auto" or env.restart_count > 0
    found = checkpoint.resume_point(run_dir) if own else None
    where = "the run's newest checkpoint" if found else f"checkpoint.resume={resume}"
    began = time.perf_counter()
    try:
        if found is None and resume not in ("auto", "never"):
            found, own = (Path(resume), checkpoint.load(Path(resume), weights=False)), False
        if found is None:
            _init_weights(cfg, parts)
            return 0
        configured = _lrs(parts)
        check_data(found[1].get("data"), parts, found[0])
        state.load_state_dict(checkpoint.apply(found[1], parts, env.rank, env.world_size))
        _check_length(cfg, parts, found)
    except ValueError as e:
        raise UserError(
            f"{where} ({found[0] if found else resume}) cannot be used: {e}",
            "resume from a checkpoint of the same model and optimizer (its run's config.yaml "
            "says which), or start afresh with checkpoint.resume=never",
        ) from None
    log.info(
        "resumed from %s (%s), read in %.1f s", found[0], state.where(), time.perf_counter() - began
    )
    if cfg.checkpoint.init is not None:
        log.info(
            "checkpoint.init=%s not used: the run continues from a checkpoint", cfg.checkpoint.init
        )
    if not own and _lrs(parts) != configured:
        log.warning(
            "checkpoint.resume=%s restores that run's optimizer state: learning rate %s "
            "(this config says %s)",
            resume,
            _lrs(parts),
            configured,
        )
    return found[1].get("metrics_rows") if own else 0


def _init_weights(cfg: Config, parts: Parts) -> None:
    """checkpoint.init: start from these model weights, with a new optimizer at step 0.

    Raises:
        UserError: the weights do not fit (init_strict: nothing is loaded).
    """
    ckpt_cfg = cfg.checkpoint
    if ckpt_cfg.init is None:
        return
    source = Path(ckpt_cfg.init).expanduser()
    weights = load_weights(source, list(parts.models))
    try:
        unfit = put_weights(parts.models, weights, ckpt_cfg.init_strict)
    except ValueError as e:
        raise UserError(
            f"checkpoint.init={ckpt_cfg.init}: the weights do not fit: {e}",
            "checkpoint.init_strict=false loads the weights that fit and lists the rest",
        ) from None
    log.info("checkpoint.init: model weights from %s", source)
    for line in unfit:
        log.warning("checkpoint.init: not loaded: %s", line)


def _check_length(cfg: Config, parts: Parts, found: tuple[Path, dict[str, Any]]) -> None:
    """Refuse to continue a schedule built for another run length (train.max_epochs or
    max_steps changed): its learning rate would jump instead of going on.

    Raises:
        UserError: the lengths differ, with the two ways to go on.
    """
    planned = found[1].get("sched_length")
    if planned is None or parts.sched_length is None or planned == parts.sched_length:
        return
    unit = "steps" if cfg.sched.interval == "step" else "epochs"
    raise UserError(
        f"sched={cfg.sched.name} of {found[0]} was built for {planned} {unit}, this config "
        f"makes the run {parts.sched_length}: its learning rate would jump, not continue",
        f"keep train.max_epochs / max_steps as the run had them, or fine-tune from its weights "
        f"with a schedule of its own in a new run: checkpoint.init={found[0]} run.dir=NEW",
    )


def _lrs(parts: Parts) -> str:
    """The optimizers' base learning rates (before any scheduler), as text."""
    groups = [g for o in parts.ctx.optimizers.values() for g in o.param_groups]
    return ", ".join(f"{g.get('initial_lr', g['lr']):g}" for g in groups)


def check_data(
    then: dict[str, Any] | None, parts: Parts, source: Path, resume: bool = True
) -> None:
    """The data a checkpoint trained on (`Parts.trained_on`; None: a checkpoint from before it
    was kept) is this run's: the same classes, by name and order (an output means a class by its
    place), and to resume, the same number of training samples (another deals every epoch
    differently: a folder that gained or lost images since).

    Raises:
        UserError: naming what changed.
    """
    if not then:
        return
    now = parts.trained_on()
    hint = (
        "give it the data it trained on; to train on this data from its weights, start a new run: "
        f"checkpoint.init={source} run.dir=NEW_DIR"
        if resume
        else "score it on data with the classes it trained on (the same folder names)"
    )
    if then["classes"] and now["classes"] and then["classes"] != now["classes"]:
        differ = [
            f"{a}/{b}" for a, b in zip(then["classes"], now["classes"], strict=False) if a != b
        ]
        raise UserError(
            f"{source} trained on classes {', '.join(then['classes'][:8])}; this data's are "
            f"{', '.join(now['classes'][:8])} ({len(differ) or 'their number'} differ"
            + (f": {', '.join(differ[:4])}" if differ else "")
            + "): the model's outputs would be read as other classes",
            hint,
        )
    if resume and then["train_samples"] != now["train_samples"]:
        raise UserError(
            f"{source} trained on {then['train_samples']} training samples; this data has "
            f"{now['train_samples']}: the data changed since (resuming would deal every later "
            "epoch differently)",
            hint,
        )


def load_weights(source: Path, names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Model weights by model name from an expctl checkpoint (a file, or a folder of shards,
    read whole), a run directory (`pick`'s default) or a plain state-dict file
    (torch.save(model.state_dict()): the one model's).

    Raises:
        UserError: the file cannot be read or holds no weights for these models.
    """
    return weights_and_data(source, names)[0]


def weights_and_data(
    source: Path, names: list[str]
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, Any] | None]:
    """`load_weights`, and what the checkpoint kept of its data (`Parts.trained_on`; None for
    a plain state dict or an older checkpoint)."""
    if source.is_dir() and not sharded.is_folder(source):
        payload = checkpoint.pick(source)[1]
        return dict(payload["models"]), payload.get("data")
    try:
        found = checkpoint.load(source) if source.is_dir() else checkpoint.read_verified(source)
    except ValueError as e:
        raise UserError(str(e), "give an expctl checkpoint or a torch.save'd state dict") from None
    if isinstance(found, dict) and found.get("format") == checkpoint.FORMAT:
        return dict(found["models"]), found.get("data")
    if not isinstance(found, dict) or not all(isinstance(v, torch.Tensor) for v in found.values()):
        raise UserError(
            f"{source} holds neither an expctl checkpoint nor a state dict of tensors",
            "save the weights with torch.save(model.state_dict(), PATH)",
        )
    if len(names) != 1:
        raise UserError(
            f"{source} is one state dict, but this config has models {', '.join(names)}",
            "start from an expctl checkpoint that holds each model",
        )
    if found and all(k.startswith("module.") for k in found):  # saved from a DDP wrapper
        found = {k.removeprefix("module."): v for k, v in found.items()}
    return {names[0]: dict(found)}, None


def put_weights(
    models: dict[str, Any], weights: dict[str, dict[str, torch.Tensor]], strict: bool
) -> list[str]:
    """Load `weights` into `models`: every tensor whose name and shape fit. Returns what did not
    fit, one entry per kind and model (missing, unexpected, other shape); with `strict`, loads
    nothing unless everything fits.

    Raises:
        ValueError: `strict` and something did not fit (what, in one line).
    """
    unfit, fitting = [], {}
    for name, model in models.items():
        own, theirs = model.state_dict(), weights.get(name, {})
        fitting[name] = {k: v for k, v in theirs.items() if k in own and _fits(own[k], v)}
        reshaped = [
            f"{k} {list(v.shape)} there, {list(own[k].shape)} here"
            for k, v in theirs.items()
            if k in own and k not in fitting[name]
        ]
        for kind, keys in (
            ("missing", [k for k in own if k not in theirs]),
            ("unexpected", [k for k in theirs if k not in own]),
            ("other shape", reshaped),
        ):
            if keys:
                more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
                unfit.append(f"model '{name}' {kind} {len(keys)}: {', '.join(keys[:3])}{more}")
    unfit += [f"model '{n}' unexpected: not in this config" for n in weights if n not in models]
    if strict and unfit:
        raise ValueError("; ".join(unfit))
    for name, model in models.items():
        sharded.put_whole(model, fitting[name])
    return unfit


def _fits(own: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Same shape; a lazy layer's parameter not yet made (nn.LazyLinear) takes its shape from
    the weights loaded into it."""
    return torch.nn.parameter.is_lazy(own) or own.shape == theirs.shape
