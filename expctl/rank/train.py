"""The training loop on one screen: `fit` runs micro-batches, optimizer steps, logging,
validation and checkpoints from a `TrainState` (`loopstate.py`) until the run's budget or the
stop signal.

It takes the config sections it uses (`train`, `checkpoint`), the built parts and a `Loop`
(ranks, reporting, the stop flag, the hooks); `entry.main` sets all of them up.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from expctl.builtin.steps import derived, no_sync
from expctl.config.schema import CheckpointConfig, EarlyStopConfig, TrainConfig
from expctl.dist import DistEnv
from expctl.errors import (
    EXIT_PREEMPTED,
    EXIT_TERMINATED,
    Preempted,
    UserError,
    choices_text,
    did_you_mean,
)
from expctl.rank import checkpoint, retention
from expctl.rank.build import Parts
from expctl.rank.collector import GarbageCollection
from expctl.rank.hparams import HParams
from expctl.rank.loopstate import Loop, TrainState
from expctl.rank.metrics import Meter, score_split, sync_buffers

log = logging.getLogger("expctl")


def finished(train_cfg: TrainConfig, state: TrainState, total_steps: int) -> bool:
    """Whether the run's budget is spent or early stopping ended it."""
    epochs_done = train_cfg.max_epochs is not None and state.epoch >= train_cfg.max_epochs
    return epochs_done or state.step >= total_steps or _stalled(train_cfg.early_stop, state)


def _step_validation(train_cfg: TrainConfig, state: TrainState) -> bool:
    """Whether train.val_every_steps asks for a validation at this step."""
    return bool(train_cfg.val_every_steps) and state.step % (train_cfg.val_every_steps or 1) == 0


def _validated_after(train_cfg: TrainConfig, epoch: int) -> int:
    """The first epoch from `epoch` (counted from 0) at whose end a validation is due (or the
    last): the epochs up to it follow each other with no pause, so their batches are read as
    one stream. With train.val_every_steps: `epoch` itself (validations fall inside epochs)."""
    if train_cfg.val_every_steps:
        return epoch
    last = epoch + (-(epoch + 1)) % train_cfg.val_every
    if train_cfg.max_epochs is not None:
        last = min(last, train_cfg.max_epochs - 1)
    return max(epoch, last)


def _said_plainly(e: ValueError, parts: Parts) -> Exception:
    """A training step's error that a setting causes, as that setting's error (exit 2, the run
    directory left as it was when nothing was saved), not a traceback: BatchNorm given one value
    per channel (one sample a batch, or a 1x1 feature map). Any other: `e` itself."""
    if "Expected more than 1 value per channel" not in str(e):
        return e
    return UserError(
        f"data.batch_size={parts.batches.batch_size}: a BatchNorm layer of the model gets one "
        "value per channel in training (one sample a batch, or a 1x1 feature map)",
        "raise data.batch_size to 2 or more per rank, or train on larger images",
    )


def _stalled(early_stop: EarlyStopConfig, state: TrainState) -> bool:
    return early_stop.monitor is not None and state.early_stall >= early_stop.patience


def fit(
    train_cfg: TrainConfig, ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> dict[str, Any]:
    """Train from `state` to the end of the budget; returns the final metrics (result.json)."""
    per_epoch = (
        parts.batches.steps_per_epoch // train_cfg.grad_accum
    ) * train_cfg.grad_accum  # micro-batches
    meter = loop.meter
    if len(state.window) == loop.env.world_size:  # restored between two train rows
        meter.load_state_dict(state.window[loop.env.rank], parts.ctx.device)
    loop.mark_step, loop.base_s = state.step, state.train_s
    loop.hparams = HParams(train_cfg.hparam_schedule, parts)
    loop.hparams.at(state.step)  # a run restored inside a segment: that segment's values
    for m in parts.ctx.models.values():
        m.train()
    with GarbageCollection(train_cfg.gc_every) as collector:
        try:
            status = _loop(train_cfg, ckpt_cfg, parts, state, loop, meter, per_epoch, collector)
        except ValueError as e:
            plain = _said_plainly(e, parts)
            if plain is e:
                raise
            raise plain from None
    return _finish(train_cfg, ckpt_cfg, parts, state, loop, status)


def _loop(
    train_cfg: TrainConfig,
    ckpt_cfg: CheckpointConfig,
    parts: Parts,
    state: TrainState,
    loop: Loop,
    meter: Meter,
    per_epoch: int,
    collector: GarbageCollection,
) -> str:
    """Epochs of micro-batches until the budget is spent or the run stops; returns its status.
    After each optimizer step, `collector` runs Python's cycle collector when due."""
    ctx, status = parts.ctx, "completed"
    while status == "completed" and (
        not finished(train_cfg, state, parts.total_steps)
        or state.batch >= per_epoch  # restored at an epoch's last step: its end is due
    ):
        done = state.batch >= per_epoch  # micro-batches past the last full accumulation: none
        batches = parts.batches.epoch(
            state.epoch, state.batch, per_epoch, _validated_after(train_cfg, state.epoch)
        )
        for batch in () if done else batches:
            if state.step >= loop.hparams.next_step:  # an int compare: no cost when unused
                loop.hparams.at(state.step)
            ctx.boundary = (state.batch + 1) % train_cfg.grad_accum == 0
            with no_sync(ctx.models, skip=not ctx.boundary):
                meter.add(parts.batch_step.train_step(ctx, batch))
            state.batch += 1
            if not ctx.boundary:
                continue
            if ctx.scaler is not None:
                ctx.scaler.update()
            state.step += 1
            loop.reporter.advance(
                state.step, state.epoch_number
            )  # the bar moves; integers only, no sync
            _step_schedulers(parts, "step")
            collector.after_step(state.step)
            if state.step % train_cfg.log_every == 0:
                _log_train(train_cfg, parts, state, meter, loop)
            if (
                _step_validation(train_cfg, state) and state.batch < per_epoch
            ):  # else: at the epoch end
                _validate(train_cfg, ckpt_cfg, parts, state, loop)
            if ckpt_cfg.every and state.step % ckpt_cfg.every == 0 and loop.saved_at != state.step:
                _save(ckpt_cfg, parts, state, loop)
            if loop.stop.agreed():
                if loop.saved_at != state.step:
                    _save(ckpt_cfg, parts, state, loop)
                code = EXIT_PREEMPTED if loop.stop.requeue else EXIT_TERMINATED
                raise Preempted(f"stopped by {loop.stop.signame} at step {state.step}", code)
            if finished(train_cfg, state, parts.total_steps) or state.batch >= per_epoch:
                break
        if state.batch >= per_epoch:
            status = _end_epoch(train_cfg, ckpt_cfg, parts, state, loop)
    return status


def _end_epoch(
    train_cfg: TrainConfig, ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> str:
    """Count the epoch, validate when due (the sweep's pruner may stop the run there: "stopped")
    and checkpoint; returns the run's status."""
    state.epoch, state.batch = state.epoch + 1, 0
    _step_schedulers(parts, "epoch")
    last = finished(train_cfg, state, parts.total_steps)
    status = "completed"
    if state.epoch % train_cfg.val_every == 0 or last or _step_validation(train_cfg, state):
        _validate(train_cfg, ckpt_cfg, parts, state, loop)
        if not last and loop.saved_at != state.step and loop.hooks.checkpoint_first():
            _save(ckpt_cfg, parts, state, loop)  # the weights scored, before a hook tells of it
        if loop.control.broadcast(loop.hooks.on_validation(state.val, state.epoch, state.step)):
            status = "stopped"  # the sweep's pruner (rank 0) stopped this trial
    if ckpt_cfg.every == 0 and not last and status == "completed" and loop.saved_at != state.step:
        _save(ckpt_cfg, parts, state, loop)
    return status


def _finish(
    train_cfg: TrainConfig,
    ckpt_cfg: CheckpointConfig,
    parts: Parts,
    state: TrainState,
    loop: Loop,
    status: str,
) -> dict[str, Any]:
    """Validate, checkpoint and test the final weights, log the last train row; write
    result.json."""
    sync_buffers(parts.models, loop.env)  # after the last step: validate and test the saved model
    if loop.validated_at != state.step and (not state.val or state.batch):
        _validate(
            train_cfg, ckpt_cfg, parts, state, loop
        )  # stopped mid-epoch (max_steps): the final weights
    if loop.saved_at != state.step and status == "completed":
        _save(ckpt_cfg, parts, state, loop)
    if loop.meter.count:  # the steps since the last train row: the run's last row, logged after
        # the checkpoint that keeps them as its window (a longer budget logs the next row whole)
        _log_train(train_cfg, parts, state, loop.meter, loop)
    test = score_split(parts, loop.env, "test") if status == "completed" else {}
    if test:
        loop.reporter.record(state.step, state.epoch_number, test, "test")
    result: dict[str, Any] = {**state.train, **state.val, **test}
    result.update(step=state.step, epoch=state.epoch_number, status=status)
    result["time/train_s"] = round(_elapsed(loop), 3)
    if _stalled(train_cfg.early_stop, state):
        result["stopped_early"] = True
    loop.reporter.result(result)
    return result


def _elapsed(loop: Loop) -> float:
    """Training time of every attempt: the earlier ones' (from the checkpoint) and this one's."""
    return loop.base_s + time.perf_counter() - loop.started


def check_monitors(names: dict[str, str], parts: Parts, env: DistEnv) -> None:
    """Before training: each monitored metric (by the key naming it) is one the validation
    reports, scored on one batch per rank (RNG streams untouched).

    Raises:
        UserError: a name the validation does not report.
    """
    if not names:
        return
    rng = checkpoint.rng_state()
    reported = score_split(parts, env, limit=1)
    checkpoint.set_rng_state(rng)
    for where, name in names.items():
        monitored(reported, where, name)


def monitored(val: dict[str, float], where: str, name: str) -> float:
    """The value of a monitored metric.

    Raises:
        UserError: the validation does not report it.
    """
    if name in val:
        return val[name]
    if not val:
        raise UserError(
            f"{where}={name}: the validation reports no metrics (no validation split, or "
            "train.step has no val_step)",
            f"remove {where}, or use data with a validation split",
        )
    raise UserError(
        f"{where}={name}: the validation does not report it.{did_you_mean(name, list(val))} "
        f"Valid: {choices_text(list(val))}",
        f"set {where} to one of the validation's metrics",
    )


def _step_schedulers(parts: Parts, interval: str) -> None:
    if parts.sched_interval == interval and parts.sched_monitor is None:
        for s in parts.schedulers.values():
            s.step()


def _validate(
    train_cfg: TrainConfig, ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> None:
    """Score the validation split with identical buffers on every rank and log it; then act on
    it: a scheduler on a metric steps, early stopping counts, checkpoint.monitor saves (none of
    it counted as training time in samples/s)."""
    if loop.validated_at == state.step:
        return
    with loop.paused(parts.ctx.device):
        _score_validation(train_cfg, ckpt_cfg, parts, state, loop)


def _score_validation(
    train_cfg: TrainConfig, ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> None:
    sync_buffers(parts.models, loop.env)
    scored = score_split(parts, loop.env, limit=parts.limit_val_batches)  # the test: never limited
    state.val = loop.control.broadcast(scored)  # rank 0's: every rank decides alike
    loop.validated_at = state.step
    if state.val:  # else: no validation split (data.val=null), no row
        loop.reporter.record(state.step, state.epoch_number, state.val, "val")
    if parts.sched_monitor is not None:
        value = monitored(state.val, "sched.monitor", parts.sched_monitor)
        for s in parts.schedulers.values():
            s.step(value)
    _early_stop(train_cfg.early_stop, state)
    if ckpt_cfg.monitor is not None and loop.saved_at != state.step:
        monitored(state.val, "checkpoint.monitor", ckpt_cfg.monitor)
        _save(ckpt_cfg, parts, state, loop)


def _early_stop(early_stop: EarlyStopConfig, state: TrainState) -> None:
    """Count the validations since `early_stop.monitor` last improved by more than
    `early_stop.min_delta`."""
    if early_stop.monitor is None:
        return
    value, best = (
        monitored(state.val, "train.early_stop.monitor", early_stop.monitor),
        state.early_best,
    )
    sign = 1.0 if early_stop.mode == "min" else -1.0
    if math.isfinite(value) and (best is None or sign * (best - value) > early_stop.min_delta):
        state.early_best, state.early_stall = value, 0
        return
    state.early_stall += 1
    if _stalled(early_stop, state):
        log.info(
            "early stop: %s has not improved on %s for %d validation(s) (min_delta %g): "
            "training ends at step %d",
            early_stop.monitor,
            "nothing" if best is None else f"{best:.6g}",
            state.early_stall,
            early_stop.min_delta,
            state.step,
        )


def _save(ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop) -> None:
    """Every rank contributes its RNG state and train-metric sums; rank 0 writes the checkpoint
    (with the validation metrics of these weights, when they were scored at this step), or
    every rank its shard of a sharded model's (not counted as training time in samples/s)."""
    with loop.paused(parts.ctx.device):
        _write_checkpoint(ckpt_cfg, parts, state, loop)


def _write_checkpoint(
    ckpt_cfg: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> None:
    sync_buffers(parts.models, loop.env)  # the saved buffers are those every rank evaluates
    rng = loop.control.gather(checkpoint.rng_state())
    state.window = loop.control.gather(loop.meter.state_dict())
    loop.saved_at = state.step
    state.train_s = round(_elapsed(loop), 3)
    payload = checkpoint.capture(parts, state.state_dict(), rng, loop.reporter.rows)
    scores = state.val if loop.validated_at == state.step else {}
    began = time.perf_counter()
    written = checkpoint.save(loop.run_dir, payload, ckpt_cfg, scores, loop.control)
    if written is not None and loop.env.is_main:
        log.info("checkpoint %s written in %.1f s", written.name, time.perf_counter() - began)


def _log_train(
    train_cfg: TrainConfig,
    parts: Parts,
    state: TrainState,
    meter: Meter,
    loop: Loop,
) -> None:
    """Reduce the running sums (the loop's one host sync) and write a train event (in the
    epoch of its newest step)."""
    now = time.perf_counter()
    state.train = meter.reduce(loop.env, "train/")
    _check_finite(train_cfg, state, loop.run_dir)
    if parts.ctx.skip_nonfinite:
        state.train["train/skipped"] = float(parts.ctx.skipped)
    global_batch = parts.batches.batch_size * loop.env.world_size * train_cfg.grad_accum
    speed = (state.step - loop.mark_step) * global_batch / max(now - loop.mark, 1e-9)
    lr = next(iter(parts.ctx.optimizers.values())).param_groups[0]["lr"]
    event = {**state.train, "lr": lr}
    if state.step > loop.mark_step:  # else: a row restored whole from a checkpoint, no step since
        event["perf/samples_per_s"] = round(speed, 1)
    device = parts.ctx.device
    if device.type == "cuda":  # the most this rank's GPU held since the last row, its weights' too
        event["perf/max_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        torch.cuda.reset_peak_memory_stats(device)
    event = derived(parts.batch_step, event)
    loop.reporter.record(state.step, state.epoch_number, event, "train")
    loop.mark, loop.mark_step = now, state.step


def _check_finite(train_cfg: TrainConfig, state: TrainState, run_dir: Path) -> None:
    """train.on_nan=stop: a non-finite loss ends the run, naming the step and last checkpoint."""
    bad = [k for k, v in state.train.items() if not math.isfinite(v)]
    if bad and train_cfg.on_nan == "stop":
        ckpts = retention.list_checkpoints(run_dir)
        last = ckpts[0].name if ckpts else "none"
        raise UserError(
            f"non-finite {bad[0]} by step {state.step} (epoch {state.epoch_number}); last checkpoint: {last}",
            "lower optim.lr, set train.grad_clip, or train.on_nan=skip to skip such updates",
        )
