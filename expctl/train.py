"""Every rank runs `main(cfg, env)`: process group, run directory, build, restore, then `fit`.

It reads the frozen config it is given and never re-enters Hydra.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from expctl import checkpoint, rundir
from expctl.build import Parts, build, pick_device, resolve_precision
from expctl.config import Config, redacted
from expctl.control import Control, Preempted, StopFlag
from expctl.dist import DistEnv, apply_env, init_process_group
from expctl.errors import RunError, UserError
from expctl.metrics import Meter, evaluate, sync_buffers
from expctl.report import (
    METRICS_FILE,
    RESULT_FILE,
    Reporter,
    read_result,
    setup_logging,
    truncate_metrics,
)
from expctl.steps import no_sync

log = logging.getLogger("expctl")


@dataclass
class TrainState:
    """Where training stands: optimizer steps, epoch, micro-batches done in the epoch."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    val: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)


def main(cfg: Config, env: DistEnv) -> tuple[Path, dict[str, Any]]:
    """Train on this rank; returns the run directory and final metrics (rank 0 writes result.json)."""
    apply_env(cfg.env, frozenset(k[4:] for k in cfg.interpolations if k.startswith("env.")))
    device = pick_device(cfg, env)
    store = init_process_group(
        env,
        "nccl" if device.type == "cuda" else "gloo",
        cfg.launcher.rdzv_timeout,
        cfg.launcher.collective_timeout,
    )
    try:
        ctl = Control(env, store)
        cfg = _agree_run_dir(cfg, env, ctl)
        run_dir = Path(str(cfg.run.dir))
        setup_logging(run_dir, env.is_main, env.rank)
        state = TrainState()
        try:
            with redacted(cfg.to_dict(resolved=True), cfg.interpolations):  # no secret shown
                parts = build(cfg, env, device)
            rows = _restore(cfg, env, parts, state, run_dir)
        except UserError:
            if env.is_main:
                setup_logging(None, True)  # release train.log
                rundir.discard_if_unstarted(run_dir)
            raise
        stored = _stored_result(cfg, env, parts, state, ctl, run_dir)
        if stored is not None:
            log.info(
                "run %s already completed (step %d, epoch %d): nothing to train; its results are "
                "in %s",
                run_dir,
                state.step,
                state.epoch,
                run_dir / RESULT_FILE,
            )
            return run_dir, stored
        dropped = truncate_metrics(run_dir, rows, state.step) if env.is_main else 0
        if dropped:
            log.info(
                "%s: dropped %d row(s) logged after step %d, where training continues",
                METRICS_FILE,
                dropped,
                state.step,
            )
        steps_left = parts.total_steps - state.step
        rep = Reporter(
            run_dir,
            env.is_main,
            parts.batches.steps_per_epoch,
            parts.total_steps,
            purge_after=state.step if dropped else None,
        )
        log.info(
            "run %s | %s x %d rank(s) on %s%s | precision %s | global batch %d (%d per rank x %d accum)"
            " | %d steps left",
            run_dir,
            env.source,
            env.world_size,
            device,
            f" via {env.master_addr}:{env.master_port}" if env.distributed else "",
            resolve_precision(cfg.train.precision, device),
            cfg.data.batch_size * env.world_size * cfg.train.grad_accum,
            cfg.data.batch_size,
            cfg.train.grad_accum,
            steps_left,
        )
        if env.is_main and env.job_id:
            from expctl import slurm

            slurm.record_job(
                run_dir,
                {
                    "job_id": env.job_id,
                    "event": "started",
                    "restart": env.restart_count,
                    "world_size": env.world_size,
                    "source": env.source,
                },
            )
        stop = StopFlag(cfg.launcher.signal, ctl)
        try:
            return run_dir, fit(cfg, env, parts, state, rep, ctl, stop)
        except Preempted:
            stop.close()
            _after_stop(cfg, env, stop, run_dir, state)
            raise
        except RuntimeError as e:
            if not env.distributed or "timed out" not in str(e).lower():
                raise
            hung = ctl.unresponsive(state.step)
            who = f"rank {', '.join(map(str, hung))}" if hung else "another rank"
            raise RunError(
                f"rank {env.rank}: {who} stopped responding near step {state.step + 1}: a collective "
                f"waited launcher.collective_timeout={cfg.launcher.collective_timeout:g} s"
            ) from None
        finally:
            stop.close()
            rep.close()
    finally:
        if env.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _agree_run_dir(cfg: Config, env: DistEnv, ctl: Control) -> Config:
    """Rank 0 creates (or reopens) the run directory; every rank learns its path."""
    reply: tuple[str, str, str | None]
    if env.is_main:
        try:
            frozen = rundir.create(cfg, env.run_id, restart=env.restart_count > 0)
            reply = ("ok", str(frozen.run.dir), None)
        except UserError as e:
            reply = ("error", e.message, e.hint)
    else:
        reply = ("", "", None)
    reply = ctl.broadcast(reply)
    if reply[0] == "error":
        raise UserError(reply[1], reply[2])
    return cfg.replace("run", dir=reply[1])


def _restore(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, run_dir: Path
) -> int | None:
    """Set `state` to where training continues: this run's newest valid checkpoint (resume=auto,
    or any restart within the launch), else the checkpoint.resume=PATH it started from, else
    the beginning.

    Returns:
        How many metrics.jsonl rows precede that point (None: a checkpoint without the count).
    """
    resume = cfg.checkpoint.resume
    own = resume == "auto" or env.restart_count > 0
    found = checkpoint.newest_valid(run_dir) if own else None
    if found is None and resume not in ("auto", "never"):
        found, own = (Path(resume), checkpoint.load(Path(resume))), False
    if found is None:
        return 0
    configured = _lrs(parts)
    position = checkpoint.apply(found[1], parts, env.rank, env.world_size)
    state.step, state.epoch, state.batch, state.val, state.train = position
    log.info("resumed from %s (step %d, epoch %d, batch %d)", found[0], *position[:3])
    if not own and _lrs(parts) != configured:
        log.warning(
            "checkpoint.resume=%s restores that run's optimizer state: learning rate %s "
            "(this config says %s)",
            resume,
            _lrs(parts),
            configured,
        )
    return found[1].get("metrics_rows") if own else 0


def _lrs(parts: Parts) -> str:
    """The optimizers' base learning rates (before any scheduler), as text."""
    groups = [g for o in parts.ctx.optimizers.values() for g in o.param_groups]
    return ", ".join(f"{g.get('initial_lr', g['lr']):g}" for g in groups)


def _stored_result(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, ctl: Control, run_dir: Path
) -> dict[str, Any] | None:
    """result.json of a run that already completed where it was restored: re-running it trains,
    evaluates and writes nothing. (A raised max_steps or max_epochs leaves steps to train.)"""
    if state.epoch < cfg.train.max_epochs and state.step < parts.total_steps:
        return None
    result = ctl.broadcast(read_result(run_dir) if env.is_main else {})
    if result.get("status") != "completed" or result.get("step") != state.step:
        return None
    return dict(result)


def _save(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, ctl: Control, rep: Reporter
) -> Path | None:
    """Every rank contributes its RNG state; rank 0 writes the checkpoint."""
    sync_buffers(parts.models, env)  # the saved buffers are those every rank evaluates
    rng = ctl.gather(checkpoint.rng_state())
    if not env.is_main:
        return None
    position = (state.step, state.epoch, state.batch, state.val, state.train)
    payload = checkpoint.capture(parts, position, rng, rep.rows)
    return checkpoint.save(Path(str(cfg.run.dir)), payload, cfg.checkpoint.keep)


def _after_stop(
    cfg: Config, env: DistEnv, stop: StopFlag, run_dir: Path, state: TrainState
) -> None:
    """After the stop checkpoint: requeue the Slurm job (submitit's mechanism, or scontrol)."""
    from expctl import slurm

    log.warning("stop signal: checkpoint of step %d saved in %s", state.step, run_dir)
    if not env.is_main or not env.job_id:
        return
    slurm.record_job(run_dir, {"job_id": env.job_id, "event": "stopped", "step": state.step})
    if env.source == "submitit" and callable(stop.previous):
        stop.previous(stop.signum, None)  # submitit: checkpoint() + scontrol requeue + exit
    else:
        slurm.requeue(env.job_id, env.restart_count, cfg.launcher.max_requeues)


@dataclass
class Clock:
    """Throughput between log lines."""

    started: float
    mark: float
    mark_step: int


def fit(
    cfg: Config,
    env: DistEnv,
    parts: Parts,
    state: TrainState,
    rep: Reporter,
    ctl: Control,
    stop: StopFlag,
) -> dict[str, Any]:
    """The loop: micro-batches, optimizer steps, logging, validation, checkpoints."""
    t, ctx, every = cfg.train, parts.ctx, cfg.checkpoint.every
    micro_per_epoch = (parts.batches.steps_per_epoch // t.grad_accum) * t.grad_accum
    meter, now = Meter(), time.perf_counter()
    clock, saved_at, status = Clock(now, now, state.step), -1, "completed"
    pruner = _pruner(cfg, env)
    for m in ctx.models.values():
        m.train()
    while status == "completed" and (
        (state.epoch < t.max_epochs and state.step < parts.total_steps)
        or state.batch >= micro_per_epoch  # restored at an epoch's last step: its end is due
    ):
        # micro-batches past the epoch's last full accumulation are never trained
        done = state.batch >= micro_per_epoch
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
            if cfg.sched.interval == "step":
                for s in parts.schedulers.values():
                    s.step()
            if state.step % t.log_every == 0:
                _log_train(cfg, env, state, meter, rep, parts, clock)
            if every and state.step % every == 0:
                _save(cfg, env, parts, state, ctl, rep)
                saved_at = state.step
            if stop.agreed():
                if saved_at != state.step:
                    _save(cfg, env, parts, state, ctl, rep)
                raise Preempted(f"stopped by SIG{cfg.launcher.signal} at step {state.step}")
            if state.step >= parts.total_steps or state.batch >= micro_per_epoch:
                break
        if state.batch >= micro_per_epoch:
            state.epoch, state.batch = state.epoch + 1, 0
            if cfg.sched.interval == "epoch":
                for s in parts.schedulers.values():
                    s.step()
            last = state.epoch >= t.max_epochs or state.step >= parts.total_steps
            if state.epoch % t.val_every == 0 or last:
                sync_buffers(parts.models, env)
                state.val = evaluate(cfg, env, parts)
                rep.record(state.step, state.epoch, state.val, "val")
                if _pruned(cfg, env, ctl, pruner, state):
                    status = "stopped"
            if every == 0 and not last and status == "completed":
                _save(cfg, env, parts, state, ctl, rep)
                saved_at = state.step
    return _finish(cfg, env, parts, state, rep, ctl, meter, clock, saved_at, status)


def _log_train(
    cfg: Config,
    env: DistEnv,
    state: TrainState,
    meter: Meter,
    rep: Reporter,
    parts: Parts,
    clock: Clock,
) -> None:
    """Reduce the running sums (the loop's one host sync) and write a train event."""
    now = time.perf_counter()
    state.train = meter.reduce(env, "train/")
    _check_finite(state, cfg)
    if parts.ctx.skip_nonfinite:
        state.train["train/skipped"] = float(parts.ctx.skipped)
    global_batch = cfg.data.batch_size * env.world_size * cfg.train.grad_accum
    speed = (state.step - clock.mark_step) * global_batch / max(now - clock.mark, 1e-9)
    lr = next(iter(parts.ctx.optimizers.values())).param_groups[0]["lr"]
    rep.record(
        state.step,
        state.epoch,
        {**state.train, "lr": lr, "perf/samples_per_s": round(speed, 1)},
        "train",
    )
    clock.mark, clock.mark_step = now, state.step


def _finish(
    cfg: Config,
    env: DistEnv,
    parts: Parts,
    state: TrainState,
    rep: Reporter,
    ctl: Control,
    meter: Meter,
    clock: Clock,
    saved_at: int,
    status: str,
) -> dict[str, Any]:
    """Final reduction, validation and checkpoint; result.json."""
    sync_buffers(parts.models, env)  # after the last step: validate and test the saved model
    if meter.count:
        state.train = meter.reduce(env, "train/")
        _check_finite(state, cfg)
    if not state.val or state.batch:  # stopped mid-epoch (max_steps): validate the final weights
        state.val = evaluate(cfg, env, parts)
        rep.record(state.step, state.epoch, state.val, "val")
    if saved_at != state.step and status == "completed":
        _save(cfg, env, parts, state, ctl, rep)
    test = evaluate(cfg, env, parts, "test") if status == "completed" else {}
    if test:
        rep.record(state.step, state.epoch, test, "test")
    result = {
        **state.train,
        **state.val,
        **test,
        "step": state.step,
        "epoch": state.epoch,
        "status": status,
        "time/train_s": round(time.perf_counter() - clock.started, 3),
    }
    rep.result(result)
    return result


def _pruner(cfg: Config, env: DistEnv) -> Any:
    """Rank 0's link to the sweep's study, when this run is a trial with a pruner."""
    if cfg.sweep.trial is None or cfg.sweep.pruner == "none" or not env.is_main:
        return None
    from expctl.study import Pruner

    return Pruner(cfg)


def _pruned(cfg: Config, env: DistEnv, ctl: Control, pruner: Any, state: TrainState) -> bool:
    """Rank 0 reports the validation to the study; every rank learns whether to stop."""
    if cfg.sweep.trial is None or cfg.sweep.pruner == "none":
        return False
    verdict = pruner.should_stop(state.val, state.epoch, state.step) if env.is_main else False
    verdict = bool(ctl.broadcast(verdict))
    if verdict:
        log.info(
            "sweep: trial %s stopped early at epoch %d (%s)",
            cfg.sweep.trial,
            state.epoch,
            cfg.sweep.pruner,
        )
    return verdict


def _check_finite(state: TrainState, cfg: Config) -> None:
    """train.on_nan=stop: a non-finite loss ends the run, naming the step and last checkpoint."""
    bad = [k for k, v in state.train.items() if not math.isfinite(v)]
    if bad and cfg.train.on_nan == "stop":
        ckpts = checkpoint.list_checkpoints(Path(str(cfg.run.dir)))
        last = ckpts[0].name if ckpts else "none"
        raise UserError(
            f"non-finite {bad[0]} by step {state.step} (epoch {state.epoch}); last checkpoint: {last}",
            "lower optim.lr, set train.grad_clip, or train.on_nan=skip to skip such updates",
        )
