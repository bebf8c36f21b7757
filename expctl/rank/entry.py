"""Every rank runs `main(cfg, env, hooks)`: environment, process group, run directory agreement,
build, restore, then `train.fit`, then teardown.

It reads the frozen config it is given and never re-enters Hydra. What the launcher or a sweep
must do around the run (job records, requeues, trial bookkeeping) reaches it only as `hooks`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from expctl.config.frozen import redacted
from expctl.config.schema import Config, TrainConfig, monitors
from expctl.dist import DistEnv, apply_env, init_process_group
from expctl.errors import (
    EXIT_PREEMPTED,
    EXIT_TERMINATED,
    Interrupted,
    OutOfMemory,
    Preempted,
    RunError,
    Terminated,
    UserError,
)
from expctl.layout import RunDir
from expctl.rank import provenance, rundir
from expctl.rank.build import Parts, build, pick_device, resolve_precision
from expctl.rank.control import Control, StopFlag
from expctl.rank.hooks import Hooks
from expctl.rank.loopstate import Loop, TrainState
from expctl.rank.provenance import Launch
from expctl.rank.report import Reporter, setup_logging, truncate_metrics
from expctl.rank.restore import restore
from expctl.rank.train import check_monitors, finished, fit

log = logging.getLogger("expctl")


def main(
    cfg: Config,
    env: DistEnv,
    hooks: Hooks | None = None,
    lock: bool = True,
    origin: Launch | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Train on this rank; returns the run directory and final metrics (rank 0 writes result.json).

    Args:
        lock: rank 0 holds the run directory's lock while it trains (False: the process that
            started this worker holds it).
        origin: the launch this attempt belongs to, for RUN_DIR/provenance.json (default: this
            process's command).
    """
    hooks = hooks or Hooks()
    device = prepare(cfg, env)
    state = TrainState()
    held: rundir.RunLock | None = None
    agreed = False  # this launch holds the run directory: its failures are the run's
    try:
        with (
            process_group(cfg, env, device) as control,
            _one_voice(control, env, state, cfg.train),
        ):
            cfg, held = _agree_run_dir(cfg, env, control, lock)
            agreed = True
            run_dir = Path(str(cfg.run.dir))
            setup_logging(run_dir, env.is_main, env.rank)
            try:
                with redacted(cfg.to_dict(resolved=True), cfg.interpolations):  # no secret shown
                    parts = build(cfg, env, device)
                with contextlib.closing(parts):  # its DataLoader workers end here
                    rows = restore(cfg, env, parts, state, run_dir)
                    check_monitors({**monitors(cfg), **hooks.monitors()}, parts, env)
                    hooks.on_start(run_dir)
                    stored = _stored_result(cfg, env, parts, state, control, run_dir)
                    if stored is not None:
                        return run_dir, _completed(stored, state, hooks, run_dir)
                    if env.is_main:
                        provenance.record(run_dir, origin or Launch.here(None), env)
                    return run_dir, _train(
                        cfg, env, parts, state, control, hooks, run_dir, rows, device
                    )
            except UserError:  # a bad value or file, met before anything was saved: leave nothing
                if env.is_main:
                    setup_logging(None, True)  # release train.log
                    if held is not None:
                        rundir.abandon(held)  # config.yaml as it was; what it made, removed
                    else:
                        rundir.discard_if_unstarted(run_dir)
                raise
    except Preempted as e:
        if env.is_main:
            log.warning("stop signal: checkpoint of step %d saved in %s", state.step, cfg.run.dir)
        if e.code == EXIT_PREEMPTED:  # launcher.signal: the job comes back (SIGTERM: it ends)
            hooks.on_stop(state.step, cfg.launcher.signal)
        raise Preempted(
            f"{e}; checkpoint saved: run the same command with run.dir={cfg.run.dir} to resume",
            e.code,
        ) from None
    except KeyboardInterrupt as e:
        if cfg.run.dir is None or not env.is_main:
            raise
        run = RunDir(Path(cfg.run.dir))
        if isinstance(e, Terminated):  # before the stop flag took SIGTERM over
            raise Preempted(run.stopped("SIGTERM"), EXIT_TERMINATED) from None
        saved = bool(run.checkpoint_files())
        raise Interrupted(f"run the same command with run.dir={cfg.run.dir}", saved=saved) from None
    except Exception as e:
        # refused the directory (another launch trains it: a sweep's trial): not this run's
        # failure to record (it marked that trial failed, and the trial died of it)
        if agreed or not isinstance(e, UserError):
            hooks.on_failure(e, False)
        raise
    finally:
        if held is not None:
            held.release()


def prepare(cfg: Config, env: DistEnv) -> Any:
    """The config's environment variables, and the device this rank computes on."""
    apply_env(cfg.env, frozenset(k[4:] for k in cfg.interpolations if k.startswith("env.")))
    return pick_device(cfg, env)


@contextlib.contextmanager
def process_group(cfg: Config, env: DistEnv, device: Any) -> Iterator[Control]:
    """The ranks' process group (nccl on CUDA, else gloo) and control group, torn down on
    leaving."""
    launcher = cfg.launcher
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        store = init_process_group(env, backend, launcher.rdzv_timeout, launcher.collective_timeout)
        yield Control(env, store)
    finally:
        if env.distributed and dist.is_initialized():
            dist.destroy_process_group()


# what a rank's collective raises when a peer's process ended (gloo, NCCL)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "ncclRemote")


@contextlib.contextmanager
def _one_voice(
    control: Control, env: DistEnv, state: TrainState, train_cfg: TrainConfig
) -> Iterator[None]:
    """One line for a failure, whichever rank met it: the first rank to fail prints its error
    (`quiet` marks the others'), and a rank whose peer's process ended says only that, in one
    line (none under the local launcher, which reports a peer that died without a word)."""
    try:
        yield
    except (UserError, RunError) as e:
        e.quiet = not control.first_to_fail()
        raise
    except torch.OutOfMemoryError as e:
        short = out_of_memory(e, env, state, train_cfg)
        short.quiet = not control.first_to_fail()
        raise short from e
    except RuntimeError as e:
        if not env.distributed or not any(s in str(e) for s in PEER_GONE):
            raise
        lost = RunError(
            f"rank {env.rank}: another rank's process ended near step {state.step + 1} "
            "(its own output says why)"
        )
        lost.quiet = env.source == "local"
        raise lost from None


def out_of_memory(
    e: BaseException, env: DistEnv, state: TrainState, train_cfg: TrainConfig
) -> OutOfMemory:
    """torch's out-of-memory error in one line: what it tried to allocate and what the GPU
    holds, and what to change (sharding first, where the model is held whole)."""
    said = str(e).split("Including non-PyTorch", 1)[0].replace("CUDA out of memory. ", "")
    ways = ["lower data.batch_size (train.grad_accum keeps the batch)"]
    if train_cfg.activation_checkpointing == "none":
        ways.append("train.activation_checkpointing=full")
    if train_cfg.strategy == "ddp":
        ways.insert(0, "train.strategy=fsdp (weights, gradients and optimizer state split over "
                       "the GPUs)")  # fmt: skip
    else:
        ways.append("more GPUs")
    return OutOfMemory(
        f"rank {env.rank}: out of GPU memory near step {state.step + 1}: {' '.join(said.split())} "
        f"To fit: {'; '.join(ways)}"
    )


def _train(
    cfg: Config,
    env: DistEnv,
    parts: Parts,
    state: TrainState,
    control: Control,
    hooks: Hooks,
    run_dir: Path,
    rows: int | None,
    device: Any,
) -> dict[str, Any]:
    """Fit from the restored state."""
    dropped = truncate_metrics(run_dir, rows, state.step) if env.is_main else 0
    if dropped:
        log.info(
            "%s: dropped %d row(s) logged after step %d, where training continues",
            RunDir.METRICS,
            dropped,
            state.step,
        )
    reporter = Reporter(
        run_dir,
        env.is_main,
        parts.total_steps,
        start_step=state.step,
        loggers=cfg.logger,
        samples_per_step=cfg.data.batch_size * env.world_size * cfg.train.grad_accum,
    )
    status = "failed"
    try:
        reporter.log_config(
            cfg.to_dict()
        )  # environment interpolations unresolved: no secret leaves
        _log_start(cfg, env, parts, state, run_dir, device)
        stop = StopFlag(cfg.launcher.signal, control)
        result = _fit(
            cfg, env, parts, state, control, Loop(env, control, reporter, stop, hooks, run_dir)
        )
        status = str(result["status"])
    except Preempted:
        status = "preempted"
        raise
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        reporter.close(status)
    hooks.on_end(result)
    return result


def _fit(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, control: Control, loop: Loop
) -> dict[str, Any]:
    """`train.fit`; a collective that timed out becomes one line naming the silent ranks."""
    try:
        return fit(cfg.train, cfg.checkpoint, parts, state, loop)
    except RuntimeError as e:
        if not env.distributed or "timed out" not in str(e).lower():
            raise
        hung = control.unresponsive(state.step)
        who = f"rank {', '.join(map(str, hung))}" if hung else "another rank"
        raise RunError(
            f"rank {env.rank}: {who} stopped responding near step {state.step + 1}: a collective "
            f"waited launcher.collective_timeout={cfg.launcher.collective_timeout:g} s"
        ) from None
    finally:
        loop.stop.close()


def _completed(
    stored: dict[str, Any], state: TrainState, hooks: Hooks, run_dir: Path
) -> dict[str, Any]:
    """The stored result of a run restored where it completed: nothing is trained or written."""
    log.info(
        "run %s already completed (%s): nothing to train; its results are in %s",
        run_dir,
        state.where(),
        RunDir(run_dir).result,
    )
    hooks.on_end(stored)
    return stored


def _log_start(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, run_dir: Path, device: Any
) -> None:
    log.info(
        "run %s | %s x %d rank(s) on %s%s | precision %s | global batch %d (%d per rank x %d accum)"
        " | %d steps left (%s) | %s%s",
        run_dir,
        launcher_name(env),
        env.world_size,
        device,
        f" via {env.master_addr}:{env.master_port}" if env.distributed else "",
        resolve_precision(cfg.train.precision, device),
        cfg.data.batch_size * env.world_size * cfg.train.grad_accum,
        cfg.data.batch_size,
        cfg.train.grad_accum,
        parts.total_steps - state.step,
        _ends(cfg.train, parts),
        parts.batches.describe(),
        f" | validation limited to {parts.limit_val_batches} batch(es) per rank"
        if parts.limit_val_batches
        else "",
    )


def _ends(train_cfg: TrainConfig, parts: Parts) -> str:
    """Which limit ends the run: max_steps=400, or max_epochs=3 x 31 steps (before max_steps)."""
    if train_cfg.max_steps is not None and parts.total_steps == train_cfg.max_steps:
        return f"max_steps={train_cfg.max_steps}"
    per_epoch = max(1, parts.batches.steps_per_epoch // train_cfg.grad_accum)
    later = f", before max_steps={train_cfg.max_steps}" if train_cfg.max_steps is not None else ""
    return f"max_epochs={train_cfg.max_epochs} x {per_epoch} steps{later}"


def launcher_name(env: DistEnv) -> str:
    """What started this rank, as the log says it: inline, local, torchrun, slurm, submitit."""
    return "inline" if env.source == "single" else env.source


def _agree_run_dir(
    cfg: Config, env: DistEnv, control: Control, lock: bool
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
    reply = control.broadcast(reply)
    if reply[0] == "error":
        raise UserError(reply[1], reply[2])
    return cfg.replace("run", dir=reply[1]), held


def _stored_result(
    cfg: Config, env: DistEnv, parts: Parts, state: TrainState, control: Control, run_dir: Path
) -> dict[str, Any] | None:
    """result.json of a run that already completed where it was restored: re-running it trains,
    evaluates and writes nothing. (A raised max_steps or max_epochs leaves steps to train.)"""
    if not finished(cfg.train, state, parts.total_steps):
        return None
    result = control.broadcast(RunDir(run_dir).read_result() if env.is_main else {})
    if result.get("status") != "completed" or result.get("step") != state.step:
        return None
    return dict(result)
