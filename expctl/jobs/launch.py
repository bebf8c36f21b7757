"""Start the ranks of a run: inline (this process), local (torch's elastic agent: agent.py), or
Slurm, and hand each rank the hooks of its job (`hooks_for`): job records and requeues
(`JobHooks`), and a sweep trial's pruning and bookkeeping (`trialhooks.TrialHooks`).

The launching process has already composed and validated the config; `local` and `slurm` create
the run directory here and hand its path to the workers, which read RUN_DIR/config.yaml.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from expctl import importpath
from expctl.config import frozen as config_mod
from expctl.config.crosschecks import check_layout
from expctl.config.schema import Config
from expctl.dist import DistEnv, check_sync_batchnorm, detect
from expctl.errors import (
    EXIT_TERMINATED,
    EXIT_USER,
    Preempted,
    Reported,
    Terminated,
    UserError,
)
from expctl.jobs import agent, exploit, slurm, snapshot, study, trialhooks
from expctl.layout import RunDir, SweepDir
from expctl.rank import entry as rank
from expctl.rank import rundir
from expctl.rank.evaluate import Evaluation, evaluate_checkpoint
from expctl.rank.hooks import Chain, Hooks
from expctl.rank.provenance import Launch
from expctl.startup import die_with_parent

log = logging.getLogger("expctl")


@dataclass
class Result:
    """What a finished run returns: its directory and final metrics (as in result.json)."""

    run_dir: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    job_id: str | None = None  # launcher=slurm

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]


def _refuse_recorded_trial(cfg: Config) -> None:
    """A sweep's trial whose end the sweep recorded stays as recorded: its table, best.yml and
    results read that folder. Rerunning it unchanged trains nothing (a completed trial); training
    it further, or again, goes to a run directory of its own.

    Raises:
        UserError: `cfg` would train in such a folder.
    """
    ref = study.TrialRef.read(cfg.run.dir)
    if ref is None:
        return
    run = RunDir(os.path.normpath(Path(str(cfg.run.dir)).absolute()))
    number = SweepDir.number_of(run.path.resolve())
    changed = rundir.changes(cfg)
    if study.is_open(ref, cfg.sweep):
        if not changed:
            return  # the trial itself, continued as the sweep would
        raise UserError(
            f"run.dir={run.path} holds trial {number} of sweep {ref.sweep_dir}, not ended: "
            f"this run differs from it ({', '.join(changed[:3])}), and the sweep would record "
            "it as the trial's",
            f"continue the trial with `expctl sweep resume {ref.sweep_dir}`, or train your "
            "changes in a run directory of your own (run.dir=NEW_DIR)",
        )
    if run.read_result().get("status") == "completed" and not changed:
        return  # trains nothing: it says so
    newest = run.checkpoint_files()
    raise UserError(
        f"run.dir={run.path} holds trial {number} of sweep {ref.sweep_dir}, "
        "which recorded its end: training it here would change what the sweep reports",
        f"train it as a run of its own: expctl run -C {run.config} run.dir=NEW_DIR"
        + (f" checkpoint.resume={newest[0]}" if newest else "")
        + " (and your changes)",
    )


def visible_gpus(cfg: Config) -> int:
    """GPUs this process would train on (0 for train.device=cpu or no CUDA)."""
    if cfg.train.device == "cpu":
        return 0
    return torch.cuda.device_count()


def launch(
    cfg: Config,
    wait: bool = True,
    evaluation: Evaluation | None = None,
    origin: Launch | None = None,
) -> Result:
    """Run `cfg` with its launcher; launcher=slurm returns once submitted unless `wait`.
    With `evaluation`, the ranks score a checkpoint of the run `cfg.run.dir` instead of training
    (inline or local; the result is RUN_DIR/eval/NAME.json). `origin`: the command this launch
    comes from, for RUN_DIR/provenance.json (default: this process's)."""
    origin = origin or Launch.here(None)
    if evaluation is None:
        _refuse_recorded_trial(cfg)
    gpus = visible_gpus(cfg)
    env = detect(os.environ, gpus_per_node=gpus if "SLURM_STEP_ID" in os.environ else None)
    if env.distributed and cfg.launcher.name != "inline":
        raise UserError(
            f"launcher={cfg.launcher.name} inside a job that already has {env.world_size} ranks ({env.source})",
            "drop the launcher override: each rank of this job trains inline",
        )
    if cfg.launcher.name == "local":
        return _local(cfg, env, gpus, evaluation, origin)
    if cfg.launcher.name == "slurm" and evaluation is not None:
        raise UserError(
            "expctl eval does not submit Slurm jobs (launcher=slurm)",
            "evaluate here with launcher=inline or launcher=local, or inside an allocation: "
            "srun expctl eval RUN_DIR launcher=inline",
        )
    if cfg.launcher.name == "slurm":
        return _slurm(cfg, wait, origin)
    return inline(cfg, env, gpus, evaluation, origin)


def _slurm(cfg: Config, wait: bool, origin: Launch) -> Result:
    slurm.parameters(cfg)  # reject bad values before anything else
    origin = origin.pin()  # the job records the code as it is now, not when it starts
    planned = snapshot.plan(cfg, origin)
    slurm.check_cluster(cfg)
    frozen, held = rundir.create(cfg, None)
    made = (held.made_dir, held.made_parents) if held is not None else (False, [])
    if held is not None:  # the job's rank 0 takes it: here it only proved no launch trains it
        held.release()
    run_dir = Path(str(frozen.run.dir))
    try:
        if planned is not None:
            origin = dataclasses.replace(
                origin, snapshot=snapshot.copy(planned, RunDir(run_dir).code)
            )
        job_id = slurm.submit(frozen, SlurmTask(str(run_dir), origin))
    except UserError:
        snapshot.discard(origin.snapshot)
        rundir.discard_if_unstarted(run_dir, *made)
        raise
    print(f"expctl: submitted job {job_id}; run directory {run_dir}", flush=True)
    print(f"expctl: follow it with `expctl status {run_dir}`", flush=True)
    if not wait:
        return Result(run_dir, {}, job_id)
    state = slurm.wait(job_id)
    metrics = RunDir(run_dir).read_result()
    if not metrics:
        raise RuntimeError(
            f"job {job_id} ended {state} without a result; see {run_dir}/slurm/ and train.log"
        )
    return Result(run_dir, metrics, job_id)


def inline(
    cfg: Config,
    env: DistEnv,
    gpus: int,
    evaluation: Evaluation | None = None,
    origin: Launch | None = None,
) -> Result:
    """Train (or evaluate) in this process, as one rank of whatever job `env` describes."""
    if gpus and env.local_world_size > gpus:
        raise UserError(
            f"{env.local_world_size} ranks on this node but {gpus} GPU(s)",
            f"start at most {gpus} ranks per node",
        )
    where = "launcher=inline" if env.source == "single" else f"from {env.source}"
    check_layout(cfg.train, env.num_nodes, env.world_size, where)
    if evaluation is not None:
        return Result(*evaluate_checkpoint(cfg, env, evaluation))
    run_dir, metrics = train_rank(cfg, env, origin=origin)
    return Result(run_dir, metrics)


def _local(
    cfg: Config, env: DistEnv, gpus: int, evaluation: Evaluation | None, origin: Launch
) -> Result:
    """Train (or evaluate) with `launcher.nproc` workers on this machine."""
    n = cfg.launcher.nproc
    if gpus and n > gpus:
        raise UserError(
            f"launcher.nproc={n} but this machine has {gpus} GPU(s): ranks would share a GPU",
            f"use launcher.nproc={gpus} or fewer, or train.device=cpu",
        )
    if cfg.train.sync_batchnorm:
        check_sync_batchnorm(n, "cuda" if gpus else "cpu")  # here, before workers start
    held, made = None, None  # made: the run directory, once made
    try:
        with contextlib.ExitStack() as stack:
            if evaluation is None:
                frozen, held = rundir.create(cfg, env.run_id)  # held here while the workers train
                run_dir = made = Path(str(frozen.run.dir))
                launch_file = (
                    Path(stack.enter_context(tempfile.TemporaryDirectory())) / "launch.json"
                )
                launch_file.write_text(origin.to_json())
                args = ["--launch", str(launch_file)]
                print(f"expctl: run directory {run_dir} ({n} local workers)", flush=True)
                if held is not None:
                    stack.callback(held.release)
            else:  # the run is only read: the workers' config goes to a temporary file
                run_dir = Path(str(cfg.run.dir))
                frozen_eval = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "eval.yaml"
                frozen_eval.write_text(config_mod.to_yaml(cfg))
                args = ["--eval", evaluation.to_json(), "--config", str(frozen_eval)]
            try:
                agent.start_workers(cfg, run_dir, args)
            except Reported as e:  # a worker's user error: nothing of this launch stays
                if evaluation is None and held is not None and e.code == EXIT_USER:
                    rundir.abandon(held)
                raise
    except Terminated:  # SIGTERM before torch's agent took it over (after: agent.py says it)
        if made is None:
            raise
        raise Preempted(RunDir(made).stopped("SIGTERM"), EXIT_TERMINATED) from None
    if evaluation is not None:
        record = json.loads(RunDir(run_dir).eval_result(evaluation.name).read_text())
        return Result(run_dir, record)
    return Result(run_dir, RunDir(run_dir).read_result())


def worker(
    run_dir: str,
    evaluation: str | None = None,
    config: str | None = None,
    launch_file: str | None = None,
) -> None:
    """Entry point of one local worker: read the frozen config, detect the rank, train (or
    evaluate: `evaluation` as `Evaluation.to_json`, with the config file `config`); the launch it
    belongs to is in `launch_file` (`Launch.to_json`)."""
    # torch's agent starts workers in sessions of their own: one orphaned by a SIGKILL-ed
    # launcher would train on beside the next launch (the launcher holds the run's lock)
    die_with_parent()
    cfg = config_mod.load(run_dir, Path(config) if config else None)
    env = dataclasses.replace(detect(os.environ), source="local")  # the agent speaks torchrun's
    if evaluation is not None:
        evaluate_checkpoint(cfg, env, Evaluation.from_json(evaluation))
        return
    origin = Launch.from_json(Path(launch_file).read_text()) if launch_file else None
    train_rank(cfg, env, under_agent=True, origin=origin)


def train_rank(
    cfg: Config, env: DistEnv, under_agent: bool = False, origin: Launch | None = None
) -> tuple[Path, dict[str, Any]]:
    """Train this rank of `cfg` with the hooks of its job, as an attempt of launch `origin`."""
    hooks = hooks_for(cfg, env, under_agent)
    return rank.main(cfg, env, hooks, lock=not under_agent, origin=origin)


def hooks_for(cfg: Config, env: DistEnv, under_agent: bool = False) -> Hooks:
    """The hooks of a rank: Slurm job records and requeues, and a sweep trial's metric (on
    every rank) and bookkeeping.

    Args:
        under_agent: a worker of a local launch, which torch's agent may restart: the sweep
            driver, not the worker, records the trial's failure.
    """
    hooks: list[Hooks] = []
    run_dir = rundir.deterministic_dir(cfg, env.run_id)
    if env.job_id and run_dir is not None:
        hooks.append(JobHooks(env, run_dir, cfg.launcher.max_requeues))
    if cfg.run.dir is not None and RunDir(cfg.run.dir).trial.exists():  # a sweep's trial
        hooks.append(trialhooks.TrialMetric(cfg.sweep))
    ref = study.TrialRef.read(cfg.run.dir) if env.is_main else None  # rank 0 speaks for a trial
    if ref is not None and study.is_open(ref, cfg.sweep):
        hooks.append(
            trialhooks.TrialHooks(
                ref,
                cfg.sweep,
                env.is_main,
                not under_agent,
                cfg.train.max_epochs,
                cfg.train.max_steps,
            )
        )
    elif ref is not None:  # re-run or continued after its sweep recorded it: a run of its own
        log.info(
            "%s was trial %d of the sweep in %s, which recorded its end: this run is not recorded "
            "there",
            cfg.run.dir,
            ref.number,
            ref.sweep_dir,
        )
    return Chain(*hooks)


class JobHooks(Hooks):
    """A rank of a Slurm job: rank 0 records the job's start and stop in RUN_DIR/jobs.jsonl and,
    after the stop checkpoint, requeues the job (`scontrol requeue`); it resumes from that
    checkpoint. Under submitit (launcher=slurm) a failed rank requeues the job too (every
    surviving rank asks, Slurm takes the first request); sbatch templates do that in the script."""

    def __init__(self, env: DistEnv, run_dir: Path, max_requeues: int) -> None:
        self.env, self.run_dir, self.max_requeues = env, run_dir, max_requeues

    def on_start(self, run_dir: Path) -> None:
        if self.env.is_main and self.env.job_id:
            slurm.record_job(
                run_dir,
                {
                    "job_id": self.env.job_id,
                    "event": "started",
                    "restart": self.env.restart_count,
                    "world_size": self.env.world_size,
                    "source": self.env.source,
                },
            )

    def on_stop(self, step: int, signame: str) -> None:
        if not self.env.is_main or not self.env.job_id:
            return
        slurm.record_job(
            self.run_dir, {"job_id": self.env.job_id, "event": "stopped", "step": step}
        )
        slurm.requeue(self.env.job_id, self.env.restart_count, self.max_requeues)

    def on_failure(self, error: BaseException, returning: bool) -> bool:
        if self.env.source != "submitit" or not self.run_dir.is_dir():
            return returning
        return slurm.requeue_after_failure(self.env, self.run_dir, error, self.max_requeues)


class SlurmTask:
    """What each task of a launcher=slurm job runs: train the frozen config of `run_dir`, as an
    attempt of the launch `origin` that submitted it, with the `imports:` modules of its code
    snapshot (`snapshot.py`) when it has one.

    submitit calls `checkpoint` when it catches the stop signal itself (outside training): the
    same task runs again after the requeue and resumes from the newest checkpoint.
    """

    def __init__(self, run_dir: str, origin: Launch | None = None) -> None:
        self.run_dir, self.origin = run_dir, origin

    def __call__(self) -> dict[str, Any]:
        importpath.search_working_dir_last()  # submitit's `python -m` put the submission folder first
        if self.origin is not None and self.origin.snapshot is not None:
            importpath.search_first(self.origin.snapshot["paths"])
        cfg = config_mod.load(self.run_dir)
        cfg = exploit.continue_as_copy(cfg) or cfg  # requeued while a PBT copy was under way
        while True:
            _, metrics = train_rank(cfg, detect(os.environ), origin=self.origin)
            copy = exploit.continue_as_copy(cfg)  # PBT: go on as a copy of a better trial
            if copy is None:
                return metrics
            cfg = copy

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        from submitit.helpers import DelayedSubmission  # noqa: PLC0415 - submitit off local runs

        return DelayedSubmission(SlurmTask(self.run_dir, self.origin))
