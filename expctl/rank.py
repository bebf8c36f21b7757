"""Every rank runs `main(cfg, env, hooks)`: environment, process group, run directory agreement,
build, restore, then `train.fit`, then teardown.

It reads the frozen config it is given and never re-enters Hydra. What the launcher or a sweep
must do around the run (job records, requeues, trial bookkeeping) reaches it only as `hooks`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from expctl import checkpoint, rundir
from expctl.build import Parts, build, pick_device, resolve_precision
from expctl.config import Config, redacted
from expctl.control import Control, StopFlag
from expctl.dist import DistEnv, apply_env, init_process_group
from expctl.errors import Interrupted, Preempted, RunError, UserError
from expctl.hooks import Hooks
from expctl.layout import RunDir
from expctl.report import Reporter, setup_logging, truncate_metrics
from expctl.train import Loop, TrainState, fit

log = logging.getLogger("expctl")


def main(
    cfg: Config, env: DistEnv, hooks: Hooks | None = None, lock: bool = True
) -> tuple[Path, dict[str, Any]]:
    """Train on this rank; returns the run directory and final metrics (rank 0 writes result.json).

    Args:
        lock: rank 0 holds the run directory's lock while it trains (False: the process that
            started this worker holds it).
    """
    hooks = hooks or Hooks()
    apply_env(cfg.env, frozenset(k[4:] for k in cfg.interpolations if k.startswith("env.")))
    device = pick_device(cfg, env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    ln = cfg.launcher
    state = TrainState()
    held: rundir.RunLock | None = None
    try:
        store = init_process_group(env, backend, ln.rdzv_timeout, ln.collective_timeout)
        ctl = Control(env, store)
        cfg, held = _agree_run_dir(cfg, env, ctl, lock)
        run_dir = Path(str(cfg.run.dir))
        setup_logging(run_dir, env.is_main, env.rank)
        try:
            with redacted(cfg.to_dict(resolved=True), cfg.interpolations):  # no secret shown
                parts = build(cfg, env, device)
            rows = _restore(cfg, env, parts, state, run_dir)
            hooks.on_start(run_dir)
            return run_dir, _train(cfg, env, parts, state, ctl, hooks, run_dir, rows, device)
        except UserError:  # a bad value or file, met before anything was saved: leave nothing
            if env.is_main:
                setup_logging(None, True)  # release train.log
                if held is not None:
                    held.release()
                rundir.discard_if_unstarted(run_dir)
            raise
    except Preempted as e:
        log.warning("stop signal: checkpoint of step %d saved in %s", state.step, cfg.run.dir)
        hooks.on_stop(state.step, ln.signal)
        raise Preempted(
            f"{e}; checkpoint saved: run the same command with run.dir={cfg.run.dir} to resume"
        ) from None
    except KeyboardInterrupt:
        if cfg.run.dir is None or not env.is_main:
            raise
        raise Interrupted(f"run the same command with run.dir={cfg.run.dir}") from None
    except Exception as e:
        hooks.on_failure(e, False)
        raise
    finally:
        if held is not None:
            held.release()
        if env.distributed:
            import torch.distributed as dist  # torch is loaded by now; kept off `import expctl`

            if dist.is_initialized():
                dist.destroy_process_group()


def _train(
    cfg: Config,
    env: DistEnv,
    parts: Parts,
    state: TrainState,
    ctl: Control,
    hooks: Hooks,
    run_dir: Path,
    rows: int | None,
    device: Any,
) -> dict[str, Any]:
    """Fit from the restored state (or return the stored result of a completed run)."""
    stored = _stored_result(cfg, env, parts, state, ctl, run_dir)
    if stored is not None:
        log.info(
            "run %s already completed (step %d, epoch %d): nothing to train; its results are in %s",
            run_dir,
            state.step,
            state.epoch,
            RunDir(run_dir).result,
        )
        hooks.on_end(stored)
        return stored
    dropped = truncate_metrics(run_dir, rows, state.step) if env.is_main else 0
    if dropped:
        log.info(
            "%s: dropped %d row(s) logged after step %d, where training continues",
            RunDir.METRICS,
            dropped,
            state.step,
        )
    rep = Reporter(
        run_dir,
        env.is_main,
        parts.batches.steps_per_epoch,
        parts.total_steps,
        purge_after=state.step if dropped else None,
    )
    _log_start(cfg, env, parts, state, run_dir, device)
    stop = StopFlag(cfg.launcher.signal, ctl)
    try:
        result = fit(
            cfg.train, cfg.checkpoint, parts, state, Loop(env, ctl, rep, stop, hooks, run_dir)
        )
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
    hooks.on_end(result)
    return result


def _log_start(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, run_dir: Path, device: Any
) -> None:
    log.info(
        "run %s | %s x %d rank(s) on %s%s | precision %s | global batch %d (%d per rank x %d accum)"
        " | %d steps left | %s%s",
        run_dir,
        env.source,
        env.world_size,
        device,
        f" via {env.master_addr}:{env.master_port}" if env.distributed else "",
        resolve_precision(cfg.train.precision, device),
        cfg.data.batch_size * env.world_size * cfg.train.grad_accum,
        cfg.data.batch_size,
        cfg.train.grad_accum,
        parts.total_steps - state.step,
        parts.batches.describe(),
        f" | validation limited to {parts.limit_val_batches} batch(es) per rank"
        if parts.limit_val_batches
        else "",
    )


def _agree_run_dir(
    cfg: Config, env: DistEnv, ctl: Control, lock: bool
) -> tuple[Config, rundir.RunLock | None]:
    """Rank 0 creates (or reopens) the run directory and takes its lock; every rank learns its
    path."""
    reply: tuple[str, str, str | None]
    held = None
    if env.is_main:
        try:
            frozen, held = rundir.create(cfg, env.run_id, env.restart_count > 0, lock)
            reply = ("ok", str(frozen.run.dir), None)
        except UserError as e:
            reply = ("error", e.message, e.hint)
    else:
        reply = ("", "", None)
    reply = ctl.broadcast(reply)
    if reply[0] == "error":
        raise UserError(reply[1], reply[2])
    return cfg.replace("run", dir=reply[1]), held


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
    where = "the run's newest checkpoint" if found else f"checkpoint.resume={resume}"
    try:
        if found is None and resume not in ("auto", "never"):
            found, own = (Path(resume), checkpoint.load(Path(resume))), False
        if found is None:
            return 0
        configured = _lrs(parts)
        state.load_state_dict(checkpoint.apply(found[1], parts, env.rank, env.world_size))
    except ValueError as e:
        raise UserError(
            f"{where} ({found[0] if found else resume}) cannot be used: {e}",
            "resume from a checkpoint of the same model and optimizer (its run's config.yaml "
            "says which), or start afresh with checkpoint.resume=never",
        ) from None
    log.info(
        "resumed from %s (step %d, epoch %d, batch %d)",
        found[0],
        state.step,
        state.epoch,
        state.batch,
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
    result = ctl.broadcast(RunDir(run_dir).read_result() if env.is_main else {})
    if result.get("status") != "completed" or result.get("step") != state.step:
        return None
    return dict(result)
