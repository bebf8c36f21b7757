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
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.config import compose
from expctl.config import frozen as config_mod
from expctl.config.schema import Config
from expctl.errors import UserError
from expctl.jobs import pbt, slurm, snapshot
from expctl.jobs.study import TrialRef, attrs_of, kept_storages, mark, open_study
from expctl.layout import RunDir, SweepDir, fresh_names
from expctl.rank import rundir
from expctl.rank.provenance import Launch
from expctl.rank.runlock import RunLock, is_locked
from expctl.sweep import ledger, results, trials
from expctl.sweep.best import Best, best
from expctl.sweep.plan import Plan, compose_point, gridded, plan, point_overrides
from expctl.sweep.pool import Pool
from expctl.sweep.space import MAX_VALUES, Dimension

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
    _check_size(size, repeat)
    _check_dims(dims, repeat)
    if s.scheduler != "pbt":  # (a population may start from one point twice: it mutates)
        notes += _said_twice(points, dims, size, s.sampler)
    if s.scheduler == "pbt":
        pbt.check(base, [d.key for d in dims], repeat)
        if size < 2:
            raise UserError(
                f"sweep.scheduler=pbt with a population of {size}: a trial copies another's "
                "weights and values, and none is there",
                "give it two or more: sweep.n_trials=4, or a list of two or more values",
            )
    if base.launcher.name != "slurm":  # a share this machine cannot give: before anything exists
        trials.plan_for(base, 1)
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
        "config_sha256": _digest(config_file),
        "plain": plain,
        "dims": [vars(d) for d in dims],
        "points": points,
        "repeat": repeat,
        "n_trials": len(points) if gridded(s, dims) else s.n_trials or DEFAULT_TRIALS,
        "created": time.time(),
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


def _check_size(configurations: int, repeat: int) -> None:
    """Before anything exists: a sweep's trials are listed up front (a typo such as
    sweep.n_trials=1e20 filled the memory of the machine)."""
    if repeat < 1:
        raise UserError(f"--repeat {repeat}: each configuration runs once at least", "--repeat 1")
    if configurations * repeat > MAX_VALUES:
        raise UserError(
            f"the sweep would run {configurations:,} configuration(s) x {repeat:,} seed(s), more "
            f"than {MAX_VALUES:,} trials",
            "sweep fewer values, or lower sweep.n_trials / --repeat",
        )


# the sweep's own settings, one value for all its trials: swept, they ran the first point's value
# for every trial (or a table ranked by another metric or direction)
_SWEEP_WIDE = ("sweep", "run", "launcher")


def _check_dims(dims: Sequence[Dimension], repeat: int) -> None:
    """Before anything exists: a swept key must be a trial's setting, and `--repeat` seeds may
    not collide with a swept train.seed."""
    for d in dims:
        if d.key.split(".")[0] in _SWEEP_WIDE:
            raise UserError(
                f"{d.key} is swept, but it is the sweep's own setting: one value for every trial",
                f"give it one value ({d.key}=...), or start one sweep per value",
            )
        if d.key == "train.seed" and repeat > 1:
            raise UserError(
                f"train.seed is swept and --repeat {repeat} adds seeds to each point: trials "
                "would train with the same seed",
                "sweep train.seed alone (train.seed=range(0,N)), or use --repeat without it",
            )


def _said_twice(
    points: list[dict[str, Any]], dims: Sequence[Dimension], size: int, sampler: str
) -> list[str]:
    """Notes on trials that will train a point again (the same run, not another seed): a grid
    point written twice, a sampler asked for more trials than a finite space holds."""
    if points:
        seen: dict[str, int] = {}
        for p in points:
            text = " ".join(f"{k}={v}" for k, v in p.items())
            seen[text] = seen.get(text, 0) + 1
        twice = [f"{text} ({n} times)" for text, n in seen.items() if n > 1]
        if twice:
            return [
                f"the grid lists {', '.join(twice[:3])}{' and more' if len(twice) > 3 else ''}: "
                "each time is a trial of its own, with the same seed (as Hydra's sweeper runs "
                "it); --repeat N trains each point with N seeds"
            ]
        return []
    finite = math.prod(len(d.values) for d in dims if d.values is not None)
    if all(d.values is not None for d in dims) and size > finite:
        return [
            f"sweep.n_trials={size} is more than the {finite} point(s) of the space: "
            f"sweep.sampler={sampler} draws some twice (the same run again, not another seed); "
            "sweep.sampler=grid runs each once, --repeat N trains each with N seeds"
        ]
    return []


def _digest(config_file: str | None) -> str | None:
    """The SHA-256 of the -C file's text (None without one, or when it is gone)."""
    if config_file is None:
        return None
    try:
        return hashlib.sha256(Path(config_file).read_bytes()).hexdigest()
    except OSError:
        return None


def _check_unchanged(spec: dict[str, Any]) -> None:
    """A sweep's trials all come from the -C file as it was when the sweep started."""
    now = _digest(spec["config_file"])
    if spec["config_file"] and now is None and spec.get("config_sha256"):
        raise UserError(
            f"-C {spec['config_file']} is gone: the sweep's trials are composed from it",
            "put it back at that path as it was (the trials' own config.yaml hold its values), "
            "or start a new sweep (`expctl run -m ...`)",
        )
    if now != spec.get("config_sha256", now):
        raise UserError(
            f"-C {spec['config_file']} changed since the sweep started: its trials would mix "
            "two configurations",
            "restore the file as it was, or start a new sweep (`expctl run -m ...`)",
        )


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
    _check_unchanged(spec)
    dims = [Dimension(**d) for d in spec["dims"]]
    study = study or open_study(sweep_dir, base.sweep)
    out = []
    for slot in todo:
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
        frozen, held = rundir.create(cfg)
        if held is not None:  # the trial's launch takes it when it starts
            held.release()
        TrialRef(str(sweep_dir), trial.number).write(trial_dir)  # the attempt's identity
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
    if any(r.status == "completed" for r in ledger.rows(sweep_dir)):
        print(_best_line(best(sweep_dir)), flush=True)
    return _outcome(sweep_dir)


def _best_line(top: Best) -> str:
    """The end-of-sweep summary of `best`: with repeats, the mean ± std over the seeds of
    the best configuration (its test metrics too), as the table ranks it."""
    results = [RunDir(r.run_dir).read_result() for r in top.trials]
    keys = [k for k in results[0] if k.startswith("test/") and all(k in x for x in results)]
    if top.std is None:
        r = top.trials[0]
        parts = [f"best trial {r.number}: {top.metric}={top.value:.4g}"]
        parts += [f"{k}={results[0][k]:.4g}" for k in keys] + [f"({r.overrides}{_copies(r)})"]
    else:
        numbers = ", ".join(str(r.number) for r in top.trials)
        parts = [
            f"best configuration: {top.metric}={top.value:.4g} ± {top.std:.2g} over {top.seeds}"
            f" (trials {numbers})"
        ]
        parts += [f"{k}={_spread([float(x[k]) for x in results])}" for k in keys]
        parts += [f"({top.label})"]
    return "  ".join(parts) + f"\n  its config: {top.path}  (expctl run -C {top.path})"


def _copies(r: ledger.Row) -> str:
    """A PBT trial's copies in brief: its values changed on the way (best.yml replays them)."""
    if not r.lineage:
        return ""
    last = r.lineage[-1]
    values = " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last["params"].items()
    )
    n = len(r.lineage)
    return (
        f"; then {n} PBT cop{'y' if n == 1 else 'ies'}, the last of trial {last['from_trial']} "
        f"at step {last['step']} with {values}"
    )


def _spread(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4g} ± {std:.2g}"


def _outcome(sweep_dir: Path) -> Outcome:
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


def _repair_journal(journal: Path) -> None:
    """A crash mid-write leaves the journal's last record torn (never committed): drop it before
    appending, or the next record would be glued to it and the journal unreadable."""
    data = journal.read_bytes() if journal.is_file() else b""  # (none: refused when read)
    if data and not data.endswith(b"\n"):
        journal.write_bytes(data[: data.rfind(b"\n") + 1])
        log.warning("%s: dropped an incomplete last record (a crash while writing it)", journal)


def _finish_cut_copies(path: Path) -> None:
    """PBT trials that died while becoming a copy of a better one (its decision recorded, the
    copy not): finish the copy here, as a requeued Slurm job does, so each resumes as what its
    checkpoint may already be (the donor's state) with its explored values and lineage, not as
    its old self."""
    from expctl.jobs.exploit import continue_as_copy  # noqa: PLC0415 - torch off the driver

    for r in ledger.rows(path):
        ref = TrialRef.read(r.run_dir) if r.status in ledger.UNFINISHED else None
        if ref is None or not attrs_of(ref).get("pbt_next"):
            continue
        mark(ref, "copying")  # (a crashed copy was marked failed)
        cfg = config_mod.load(r.run_dir).replace("run", dir=r.run_dir)
        try:
            continue_as_copy(cfg)
        except (OSError, ValueError) as e:  # the donor's frozen state is gone or damaged
            mark(ref, r.status, pbt_next=None)
            log.warning(
                "trial %d: its PBT copy cannot be finished (%s): it resumes as it was", r.number, e
            )


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


def resume(sweep_dir: str | Path, skip_failed: bool = False) -> Outcome:
    """Re-run the trials that failed (unless `skip_failed`), were interrupted or were lost (in
    their own directories, resuming their checkpoints), and the ones the sweep never got to."""
    path = Path(sweep_dir).absolute()
    if not SweepDir(path).spec.is_file():
        raise UserError(
            f"{path}: not a sweep directory (no {SweepDir.SPEC})",
            "pass the folder `expctl run -m` printed",
        )
    with driving(path):
        return _resume(path, skip_failed)


def _resume(path: Path, skip_failed: bool) -> Outcome:
    import optuna  # noqa: PLC0415 - Optuna off `run -m`'s checks: a bad sweep fails without it

    spec = SweepDir(path).read_spec()
    _check_unchanged(spec)
    _repair_journal(SweepDir(path).journal)
    frozen = SweepDir(path).trials()
    base = (
        config_mod.load(frozen[0].path)
        if frozen
        else compose.compose(spec["config_file"], spec["plain"])
    )
    if base.sweep.scheduler == "pbt":
        _finish_cut_copies(path)
    study = ledger.read_study(path, base.sweep, to_write=True)
    todo: list[Slot] = []
    for r in ledger.rows(path):
        if r.status == "failed" and skip_failed:
            continue
        if r.status in ledger.UNFINISHED:
            assert r.optuna_trial is not None, "a trial that ended was started"
            study.tell(r.optuna_trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx, True, r.lineage))
        elif r.optuna_trial is None:  # never started
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx))
    if not todo:
        what = "completed, was stopped or failed" if skip_failed else "completed or was stopped"
        print(f"expctl: nothing to resume in {path}: every trial {what}")
        return _outcome(path)
    print(f"expctl: resuming {len(todo)} trial(s) of {path}", flush=True)
    return run_trials(path, base, todo, Launch.here(spec["config_file"]).pin())
