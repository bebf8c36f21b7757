"""Sweeps: `expctl run -m`, on Optuna's ask/tell API with a journal file as the ledger.

The command line keeps Hydra's multirun grammar (``a=1,2``, ``range()``, ``choice()``,
``interval()``, ``tag(log, ...)``), parsed by Hydra's own override parser (`space.py`) and
planned before anything exists (`plan.py`); each trial is then composed once, frozen into
``SWEEP_DIR/trial_NNN`` and launched like any run (this module drives it). The study lives in
``SWEEP_DIR/journal.log`` (Optuna's JournalStorage: safe for many writers on a shared
filesystem), so ranks of a trial report to it, other processes read it while trials run, and an
interrupted sweep resumes from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config import frozen as config_mod
from expctl.config.schema import Config
from expctl.errors import UserError
from expctl.jobs import slurm, snapshot
from expctl.jobs.study import TrialRef, kept_storages, open_study
from expctl.layout import RunDir, SweepDir, fresh_names
from expctl.rank import rundir
from expctl.rank.provenance import Launch
from expctl.rank.runlock import RunLock, is_locked
from expctl.sweep import ledger, results, trials
from expctl.sweep.best import best
from expctl.sweep.plan import Plan, check_sweep, compose_point, gridded, plan, point_overrides
from expctl.sweep.pool import Pool
from expctl.sweep.space import Dimension
from expctl.sweep.unchanged import (
    check_point,
    check_unchanged,
    digest,
    point_config,
    point_digests,
)

log = logging.getLogger("expctl")

DEFAULT_TRIALS = 10  # random / TPE sweeps without sweep.n_trials


@dataclass
class Outcome:
    """How a sweep (or its resume) ended, from its ledger; `failed` counts failed and lost trials."""

    sweep_dir: Path
    trials: int
    failed: int


def new_sweep_dir(root: Path, name: str | None = None) -> Path:
    """Create a fresh sweep directory atomically (two sweeps never share one):
    NAME-sweep-TIME-XXXX, or sweep-TIME-XXXX without a name."""
    prefix = f"{name}-sweep" if name else "sweep"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o750)
        for fresh in fresh_names(prefix):
            path = root / fresh
            try:
                path.mkdir(mode=0o750)
                return path
            except FileExistsError:
                continue
    except OSError as e:
        raise UserError(
            f"cannot create a sweep directory under run.root={root}: {e.strerror or e}",
            "pick a writable run.root (or free space there)",
        ) from None
    raise UserError(f"could not create a sweep directory under {root}", "check run.root")


def multirun(
    config_file: str | None,
    overrides: Sequence[str],
    repeat: int | None = None,
    pool: Pool | None = None,
) -> Outcome:
    """`expctl run -m`: validate, create the sweep and its study, then run (or submit) trials.
    `pool`: the local trials' forker, if the caller started it earlier (cli.py)."""
    notes: list[str] = []

    # the local trials' forker starts first: it imports torch while the points are composed
    # (seconds of each; on Slurm it is closed once the first point says so)
    pool = pool or Pool()
    try:
        # every point is valid before anything exists
        space = plan(config_file, overrides, notes)
        local = space.base.launcher.name != "slurm"
        if not local:
            pool.close()
        return _multirun(config_file, overrides, space, notes, repeat, pool if local else None)
    finally:
        pool.close()  # a second close does nothing


def _multirun(
    config_file: str | None,
    overrides: Sequence[str],
    space: Plan,
    notes: list[str],
    repeat: int | None,
    pool: Pool | None,
) -> Outcome:
    base, plain, dims, points = space.base, space.plain, space.dims, space.points
    s = base.sweep
    if repeat is not None and s.repeat not in (1, repeat):
        notes.append(f"--repeat {repeat} is used, not sweep.repeat={s.repeat}")
    repeat = s.repeat if repeat is None else repeat
    size = len(points) if gridded(s, dims) else s.n_trials or DEFAULT_TRIALS
    notes += check_sweep(base, dims, points, repeat, size)
    if base.launcher.name != "slurm":  # a share this machine cannot give: before anything exists
        at_once = trials.plan_for(base, size).concurrent
        if s.scheduler == "pbt" and at_once < size:
            notes.append(
                f"a population of {size} with {at_once} trial(s) at a time here: a trial is "
                "compared only with those running beside it (more at once: "
                f"sweep.max_concurrent={size}, sharing the machine)"
            )
    for note in dict.fromkeys(notes):
        print(f"expctl: note: {note}", file=sys.stderr)
    origin = Launch.here(config_file, overrides).pin()  # the code of every trial: as it is now
    planned = snapshot.plan(base, origin) if base.launcher.name == "slurm" else None
    # run.name's built-in default, model-data (conf/config.yaml), would name the first point only
    named = base.run.name != f"{base.model.name}-{base.data.name}"
    root = Path(base.run.root).expanduser().absolute()
    root_existed = root.exists()
    sweep_dir = new_sweep_dir(root, base.run.name if named else None)
    spec = {
        "config_file": str(Path(config_file).absolute()) if config_file else None,
        "config_sha256": digest(config_file),
        "plain": plain,
        "dims": [vars(d) for d in dims],
        "points": points,
        "repeat": repeat,
        "n_trials": len(points) if gridded(s, dims) else s.n_trials or DEFAULT_TRIALS,
        "created": time.time(),
        # what the files it composes made of its first point: `sweep resume` composes it again
        "base": {"overrides": space.first, "config": base.to_dict()},
        "point_digests": point_digests(config_file, plain, points),
    }
    try:
        SweepDir(sweep_dir).spec.write_text(json.dumps(spec, indent=2) + "\n")
        open_study(sweep_dir, s, create=True)
    except OSError as e:  # a full disk: no half-made sweep stays behind
        shutil.rmtree(sweep_dir, ignore_errors=True)
        if not root_existed:
            with contextlib.suppress(OSError):
                root.rmdir()
        raise UserError(
            f"cannot write the sweep's files under run.root={sweep_dir.parent}: {e.strerror or e}",
            "free space there, or pick another run.root",
        ) from None
    print(
        f"expctl: sweep directory {sweep_dir} ({spec['n_trials']} configuration(s) x {repeat} seed(s))",
        flush=True,
    )
    with driving(sweep_dir):
        return run_trials(sweep_dir, base, origin=origin, planned=planned, pool=pool)


@dataclass(frozen=True)
class Slot:
    """A trial to start: its number (its directory, trial_NNN), grid point ({}: the sampler
    picks one), seed index, and whether it retries a failed or lost attempt in its directory."""

    number: int
    params: dict[str, Any]
    seed_idx: int = 0
    retry: bool = False
    # PBT: the copies the retried attempt made (its config.yaml holds where they led)
    lineage: list[dict[str, Any]] = dataclasses.field(default_factory=list, compare=False)


def _trial_configs(
    sweep_dir: Path, base: Config, todo: list[Slot], study: Any = None
) -> list[Config]:
    """Ask the study (opened here, or `study`: one kept by the driver, which reads only what was
    appended to the journal since) for each slot's trial and freeze its config into its
    directory."""
    spec = SweepDir(sweep_dir).read_spec()
    check_unchanged(spec)
    dims = [Dimension(**d) for d in spec["dims"]]
    study = study or open_study(sweep_dir, base.sweep)
    out = []
    for slot in todo:
        if slot.params and not slot.seed_idx and not (slot.retry and slot.lineage):
            check_point(spec, slot.number, slot.params, point_config(spec, slot.params))
        params = slot.params or _first_seeds(study, slot)
        if params:
            study.enqueue_trial(params, skip_if_exists=False)
        trial = study.ask({d.key: d.distribution() for d in dims})
        chosen = dict(trial.params)
        overrides = point_overrides(spec["plain"], chosen)
        vary = list(chosen)
        if slot.seed_idx:
            overrides.append(f"train.seed={base.train.seed + slot.seed_idx}")
            vary.append("train.seed")
        trial_dir = SweepDir(sweep_dir).trial(slot.number).path
        attrs = {
            "overrides": ledger.label(chosen, slot.seed_idx),
            "config": json.dumps(chosen, sort_keys=True),
            "status": "pending",
            "run_dir": str(trial_dir),
            "seed_idx": slot.seed_idx,
            # the driver's: a pending trial whose driver died before starting it is lost
            "pid": os.getpid(),
            "host": socket.gethostname(),
        }
        if slot.retry:
            attrs["retry_of"] = slot.number
        if slot.lineage:
            attrs["lineage"] = slot.lineage
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if slot.retry and slot.lineage:  # a PBT trial that copied: it goes on as its copy does
            cfg = config_mod.load(trial_dir).replace("run", dir=str(trial_dir))
        else:
            cfg = compose_point(spec["config_file"], overrides, vary=vary)
            cfg = cfg.replace("run", dir=str(trial_dir))
        if slot.retry:  # a retry continues the failed trial's own checkpoints
            cfg = cfg.replace("checkpoint", resume="auto")
        trial.set_user_attr("seed", cfg.train.seed)  # the table's `seed`
        theirs = RunDir(trial_dir).config.is_file() and not RunDir(trial_dir).trial.is_file()
        try:
            frozen, held = rundir.create(cfg, sweep_trial=True)
        except UserError as e:
            if not theirs:
                raise
            raise UserError(  # put there by hand (or by an older expctl): not the sweep's
                f"trial {slot.number}'s folder holds a run the sweep did not start: {e.message}",
                f"move {trial_dir} out of the sweep's directory",
            ) from None
        if held is not None:  # the trial's launch takes it when it starts
            held.release()
        TrialRef(str(sweep_dir), trial.number).write(trial_dir, spec.get("created"))
        out.append(frozen)
    return out


def _first_seeds(study: Any, slot: Slot) -> dict[str, Any]:
    """A sampled point's values for its repeat `slot` (seed index 1 or more): the ones its
    first seed's trial drew (asked before it: repeats follow their first seed), {} for a
    first seed (the sampler draws it)."""
    if not slot.seed_idx:
        return {}
    first = slot.number - slot.seed_idx
    for t in reversed(study.get_trials(deepcopy=False)):  # its latest attempt
        if ledger.number_of(t) == first and "config" in t.user_attrs:
            return dict(json.loads(t.user_attrs["config"]))
    raise AssertionError(f"trial {slot.number}: its first seed's trial {first} was never asked")


def run_trials(
    sweep_dir: Path,
    base: Config,
    todo: list[Slot] | None = None,
    origin: Launch | None = None,
    planned: snapshot.Plan | None = None,
    pool: Pool | None = None,
) -> Outcome:
    """Run the sweep's (remaining) trials: one after another here, or as a Slurm job array (whose
    trials have not ended when this returns: none counts as failed).

    Args:
        origin: the command that runs them (`expctl run -m`, `sweep resume`), pinned.
        planned: the code snapshot of a Slurm sweep, checked before the sweep was created
            (None: planned here, once the trials' `imports:` are imported).
        pool: the local trials' forker, started early (None: started here).
    """
    origin = origin or Launch.here(None).pin()
    if todo is None:
        plan = ledger.planned(SweepDir(sweep_dir).read_spec())
        todo = [Slot(n, p, i) for n, (p, i) in enumerate(plan)]
    if base.launcher.name == "slurm":
        from expctl.jobs import launch  # noqa: PLC0415 - torch off a local sweep's driver

        cfgs = _trial_configs(sweep_dir, base, todo)
        planned = planned or snapshot.plan(base, origin)
        if planned is not None:
            code = snapshot.copy(planned, SweepDir(sweep_dir).code)
            origin = dataclasses.replace(origin, snapshot=code)
        tasks = [launch.SlurmTask(str(c.run.dir), origin) for c in cfgs]
        jobs = slurm.submit_array(cfgs, tasks, sweep_dir)
        print(
            f"expctl: submitted {len(cfgs)} trial(s) as job(s) {', '.join(sorted(set(jobs)))}",
            flush=True,
        )
        print(f"expctl: follow them with `expctl sweep table {sweep_dir}`", flush=True)
        return Outcome(sweep_dir, len(cfgs), 0)
    use = trials.plan_for(base, len(todo))

    study = open_study(sweep_dir, base.sweep)

    def make_config(slot: Slot) -> Config:
        (cfg,) = _trial_configs(sweep_dir, base, [slot], study)
        return trials.with_share(cfg, use.share)

    with kept_storages():  # the driver's loop reads the journal as it grows
        trials.run_local(sweep_dir, use, todo, make_config, origin, base.sweep, pool)
    print(results.table(sweep_dir))
    rows = ledger.rows(sweep_dir)
    if any(r.status == "completed" for r in rows):
        print(best(sweep_dir).describe(), flush=True)
    if note := _no_pbt_round(rows, base.sweep):
        print(f"expctl: note: {note}", file=sys.stderr, flush=True)
    return outcome(sweep_dir)


def _no_pbt_round(rows: list[ledger.Row], s: Any) -> str | None:
    """Why a PBT sweep whose trials all ended never compared them, if that is so: its trials
    stopped (train.max_steps) before a round's epoch (checked before the start only for
    train.max_epochs: the epochs a number of steps makes are known once the data is)."""
    if s.scheduler != "pbt" or any(r.lineage for r in rows):
        return None
    if any(r.status in ("pending", "running") for r in rows):
        return None
    epochs = [r.epoch for r in rows if r.epoch is not None]
    if not epochs or max(epochs) > s.pbt.interval:
        return None
    return (
        f"no PBT round took place: sweep.pbt.interval={s.pbt.interval} compares trials every "
        f"{s.pbt.interval} epoch(s), never at the last, and they trained {max(epochs)} at most "
        "(train.max_steps): "
        + ("a lower sweep.pbt.interval, or more steps" if s.pbt.interval > 1 else "more steps")
    )


def outcome(sweep_dir: Path) -> Outcome:
    """Count the sweep's failed (or lost) trials and say so in one line on stderr."""
    live = ledger.rows(sweep_dir)
    failed = sum(r.status in ("failed", "lost") for r in live)
    if failed:
        print(
            f"expctl: {failed} of {len(live)} trial(s) failed: see `expctl sweep table {sweep_dir}`",
            file=sys.stderr,
            flush=True,
        )
    return Outcome(sweep_dir, len(live), failed)


@contextlib.contextmanager
def driving(sweep_dir: Path) -> Iterator[None]:
    """The sweep held by this driver, its one driver, while inside (`sweep resume` beside a
    live driver started its trials again, and took a completed one for lost): SWEEP_DIR/.lock,
    as a run directory's, released by the kernel when the driver dies."""
    try:
        held = RunLock(sweep_dir)
    except UserError:
        raise UserError(
            f"sweep {sweep_dir} is being run by another driver "
            f"({is_locked(sweep_dir) or 'it just ended'})",
            f"follow it with `expctl sweep table {sweep_dir}`; to stop it, Ctrl-C (or SIGTERM) "
            "that driver: its trials stop at a checkpoint, and `expctl sweep resume` continues",
        ) from None
    try:
        yield
    except UserError:  # refused: nothing of this driver stays behind
        if held.made_lock:
            held.path.unlink(missing_ok=True)
        raise
    finally:
        held.release()
