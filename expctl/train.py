"""The training loop on one screen: `fit` runs micro-batches, optimizer steps, logging,
validation and checkpoints from a `TrainState` until the run's budget or the stop signal.

It takes the config sections it uses (`train`, `checkpoint`), the built parts and a `Loop`
(ranks, reporting, the stop flag, the hooks); `rank.main` sets all of them up.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl import checkpoint
from expctl.build import Parts
from expctl.config import CheckpointConfig, TrainConfig
from expctl.control import Control, StopFlag
from expctl.dist import DistEnv
from expctl.errors import Preempted, UserError
from expctl.hooks import Hooks
from expctl.metrics import Meter, evaluate, sync_buffers
from expctl.report import Reporter
from expctl.steps import no_sync


@dataclass
class TrainState:
    """Where training stands: optimizer steps, epochs done, micro-batches done in the epoch, and
    the last validation and train metrics."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    val: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch": self.batch,
            "val": dict(self.val),
            "train": dict(self.train),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.epoch, self.batch = int(sd["step"]), int(sd["epoch"]), int(sd["batch"])
        self.val, self.train = dict(sd.get("val") or {}), dict(sd.get("train") or {})


@dataclass
class Loop:
    """What the loop talks to besides the parts: the ranks, rank 0's outputs, the stop signal,
    the hooks of the launcher and the sweep, and its own clocks."""

    env: DistEnv
    ctl: Control
    rep: Reporter
    stop: StopFlag
    hooks: Hooks
    run_dir: Path
    started: float = field(default_factory=time.perf_counter)
    mark: float = field(default_factory=time.perf_counter)  # throughput since the last log line
    mark_step: int = 0
    saved_at: int = -1  # the step of the newest checkpoint this launch wrote


def fit(
    t: TrainConfig, ck: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop
) -> dict[str, Any]:
    """Train from `state` to the end of the budget; returns the final metrics (result.json)."""
    per_epoch = (parts.batches.steps_per_epoch // t.grad_accum) * t.grad_accum  # micro-batches
    meter, ctx, status = Meter(), parts.ctx, "completed"
    loop.mark_step = state.step
    for m in ctx.models.values():
        m.train()
    while status == "completed" and (
        (state.epoch < t.max_epochs and state.step < parts.total_steps)
        or state.batch >= per_epoch  # restored at an epoch's last step: its end is due
    ):
        done = state.batch >= per_epoch  # micro-batches past the last full accumulation: none
        for batch in () if done else parts.batches.epoch(state.epoch, start=state.batch):
            ctx.boundary = (state.batch + 1) % t.grad_accum == 0
            with no_sync(ctx.models, skip=not ctx.boundary):
                meter.add(parts.step.train_step(ctx, batch))
            state.batch += 1
            if not ctx.boundary:
                continue
            if ctx.scaler is not None:
                ctx.scaler.update()
            state.step += 1
            _step_schedulers(parts, "step")
            if state.step % t.log_every == 0:
                _log_train(t, parts, state, meter, loop)
            if ck.every and state.step % ck.every == 0:
                _save(ck, parts, state, loop)
            if loop.stop.agreed():
                if loop.saved_at != state.step:
                    _save(ck, parts, state, loop)
                raise Preempted(f"stopped by SIG{loop.stop.signame} at step {state.step}")
            if state.step >= parts.total_steps or state.batch >= per_epoch:
                break
        if state.batch >= per_epoch:
            state.epoch, state.batch = state.epoch + 1, 0
            _step_schedulers(parts, "epoch")
            last = state.epoch >= t.max_epochs or state.step >= parts.total_steps
            if state.epoch % t.val_every == 0 or last:
                _validate(parts, state, loop)
                if loop.ctl.broadcast(loop.hooks.on_validation(state.val, state.epoch, state.step)):
                    status = "stopped"  # the sweep's pruner (rank 0) stopped this trial
            if ck.every == 0 and not last and status == "completed":
                _save(ck, parts, state, loop)
    sync_buffers(parts.models, loop.env)  # after the last step: validate and test the saved model
    if meter.count:
        state.train = meter.reduce(loop.env, "train/")
        _check_finite(t, state, loop.run_dir)
    if not state.val or state.batch:  # stopped mid-epoch (max_steps): validate the final weights
        _validate(parts, state, loop)
    if loop.saved_at != state.step and status == "completed":
        _save(ck, parts, state, loop)
    test = evaluate(parts, loop.env, "test") if status == "completed" else {}
    if test:
        loop.rep.record(state.step, state.epoch, test, "test")
    elapsed = round(time.perf_counter() - loop.started, 3)
    result: dict[str, Any] = {**state.train, **state.val, **test}
    result.update(step=state.step, epoch=state.epoch, status=status, **{"time/train_s": elapsed})
    loop.rep.result(result)
    return result


def _step_schedulers(parts: Parts, interval: str) -> None:
    if parts.sched_interval == interval:
        for s in parts.schedulers.values():
            s.step()


def _validate(parts: Parts, state: TrainState, loop: Loop) -> None:
    """Score the validation split with identical buffers on every rank, and log it."""
    sync_buffers(parts.models, loop.env)
    state.val = evaluate(parts, loop.env)
    loop.rep.record(state.step, state.epoch, state.val, "val")


def _save(ck: CheckpointConfig, parts: Parts, state: TrainState, loop: Loop) -> None:
    """Every rank contributes its RNG state; rank 0 writes the checkpoint."""
    sync_buffers(parts.models, loop.env)  # the saved buffers are those every rank evaluates
    rng = loop.ctl.gather(checkpoint.rng_state())
    loop.saved_at = state.step
    if loop.env.is_main:
        payload = checkpoint.capture(parts, state.state_dict(), rng, loop.rep.rows)
        checkpoint.save(loop.run_dir, payload, ck.keep)


def _log_train(t: TrainConfig, parts: Parts, state: TrainState, meter: Meter, loop: Loop) -> None:
    """Reduce the running sums (the loop's one host sync) and write a train event."""
    now = time.perf_counter()
    state.train = meter.reduce(loop.env, "train/")
    _check_finite(t, state, loop.run_dir)
    if parts.ctx.skip_nonfinite:
        state.train["train/skipped"] = float(parts.ctx.skipped)
    global_batch = parts.batches.batch_size * loop.env.world_size * t.grad_accum
    speed = (state.step - loop.mark_step) * global_batch / max(now - loop.mark, 1e-9)
    lr = next(iter(parts.ctx.optimizers.values())).param_groups[0]["lr"]
    event = {**state.train, "lr": lr, "perf/samples_per_s": round(speed, 1)}
    loop.rep.record(state.step, state.epoch, event, "train")
    loop.mark, loop.mark_step = now, state.step


def _check_finite(t: TrainConfig, state: TrainState, run_dir: Path) -> None:
    """train.on_nan=stop: a non-finite loss ends the run, naming the step and last checkpoint."""
    bad = [k for k, v in state.train.items() if not math.isfinite(v)]
    if bad and t.on_nan == "stop":
        ckpts = checkpoint.list_checkpoints(run_dir)
        last = ckpts[0].name if ckpts else "none"
        raise UserError(
            f"non-finite {bad[0]} by step {state.step} (epoch {state.epoch}); last checkpoint: {last}",
            "lower optim.lr, set train.grad_clip, or train.on_nan=skip to skip such updates",
        )
