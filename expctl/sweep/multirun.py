"""Sweeps: `expctl run -m`, on Optuna's ask/tell API with a journal file as the ledger.

The command line keeps Hydra's multirun grammar (``a=1,2``, ``range()``, ``choice()``,
``interval()``, ``tag(log, ...)``), parsed by Hydra's own override parser (`space.py`); each
trial is then composed once, frozen into ``SWEEP_DIR/trial_NNN`` and launched like any run. The study lives in
``SWEEP_DIR/journal.log`` (Optuna's JournalStorage: safe for many writers on a shared
filesystem), so ranks of a trial report to it, other processes read it while trials run, and an
interrupted sweep resumes from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import multiprocessing
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl import dist
from expctl.config import compose, layers
from expctl.config import frozen as config_mod
from expctl.config.schema import Config, SweepConfig
from expctl.errors import UserError
from expctl.jobs import pbt, slurm, snapshot
from expctl.jobs.study import TrialRef, open_study
from expctl.layout import RunDir, SweepDir
from expctl.rank import rundir
from expctl.rank.provenance import Launch
from expctl.sweep import ledger, results
from expctl.sweep.ledger import Best
from expctl.sweep.pool import Pool
from expctl.sweep.space import MAX_VALUES, Dimension, check_values, grid, parse_space

log = logging.getLogger("expctl")

DEFAULT_TRIALS = 10  # random / TPE sweeps without sweep.n_trials


def _override(key: str, value: Any) -> str:
    return f"{key}={value}"


@dataclass
class Plan:
    """What `expctl run -m` runs: the config of its first point (the sweep's settings), the
    overrides every trial gets, the dimensions, and the grid's points in order ([] when a
    sampler picks them)."""

    base: Config
    plain: list[str]
    dims: list[Dimension]
    points: list[dict[str, Any]]


def plan(
    config_file: str | None,
    overrides: Sequence[str],
    notes: list[str],
    on_base: Callable[[Config], None] | None = None,
) -> Plan:
    """The sweep of `expctl run -C config_file -m overrides`, every grid point composed (so
    valid) before anything is created; `on_base` is called with the first point's config before
    the others are composed.

    The search space is Hydra's: the config's ``sweep.params``, then the command line, the last
    value of a key winning (defaults < config file < command line); ``shuffle()`` draws from
    ``sweep.seed``. `notes` receives compose's notes (settings an override set aside).
    """
    options = functools.partial(_group_options, config_file)
    plain, dims = parse_space(overrides, options=options)
    first = _overrides(plain, {d.key: d.values[0] for d in dims if d.values})
    # the sweep's own settings (sweep.params, seed, sampler) come from a composed config
    base = _compose(config_file, first, notes)
    s = base.sweep
    plain, dims = parse_space(overrides, s.params, s.seed, options)
    check_values(dims)
    points = grid(dims) if gridded(s, dims) else []
    if s.n_trials:
        points = points[: s.n_trials]
    heads = points or [{d.key: d.values[0] for d in dims if d.values}]
    over = _overrides(plain, heads[0])
    if over != first:  # sweep.params or a shuffle moved the first point
        base = _compose(config_file, over, notes)
    if on_base is not None:
        on_base(base)
    others = [_overrides(plain, point) for point in heads[1:]]
    vary = [d.key for d in dims]
    for d in dims:  # an interval's ends are values a trial (or a PBT mutation) may get
        for end in (d.low, d.high) if d.values is None else ():
            value = round(end) if d.integer and end is not None else end
            others.append(_overrides(plain, {**heads[0], d.key: value}))
    _compose_all(config_file, others, notes, vary)
    return Plan(base, plain, dims, points)


def _compose_all(
    config_file: str | None, todo: list[list[str]], notes: list[str], vary: list[str]
) -> None:
    """Compose every override list of `todo` (which differ in the values of `vary`'s keys) into
    the cache, the first bad one raising. A point takes ~0.07 s of one core (~0.3 s when Hydra
    composes it whole: a component or a preset varies), so a large grid is composed by forked
    copies of this process (its imports and first composition done) on the cores it may use."""
    todo = [o for o in todo if _key(config_file, o) not in _COMPOSED]
    if todo:  # Hydra's composition of what the points share, made once, before any fork
        _compose(config_file, todo.pop(0), notes, vary)
    workers = min(dist.usable_cores(), len(todo) // _PER_WORKER)
    if workers < 2 or threading.active_count() > 1:  # a fork copies other threads' locks held
        for over in todo:
            _compose(config_file, over, notes, vary)
        return
    chunks = [todo[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        done = list(pool.map(_compose_chunk, [config_file] * workers, chunks, [vary] * workers))
    outcome: dict[tuple[str, ...], _Composed] = {}
    for chunk, results_ in zip(chunks, done, strict=True):
        outcome.update(zip(map(tuple, chunk), results_, strict=False))
    for over in todo:  # in the order written: the first bad point is the one named
        cfg, point_notes, error = outcome[tuple(over)]
        notes += point_notes
        if error is not None:
            raise UserError(*error)
        assert cfg is not None
        _COMPOSED[_key(config_file, over)] = cfg


_PER_WORKER = 16  # fewer points than this per core: forking costs more than it saves
# a point's config (None: bad), its notes, and the message and hint of why it is bad
_Composed = tuple[Config | None, list[str], tuple[str, str | None] | None]


def _compose_chunk(
    config_file: str | None, chunk: list[list[str]], vary: list[str]
) -> list[_Composed]:
    """In a forked copy: compose each override list until one is bad."""
    out: list[_Composed] = []
    for over in chunk:
        notes: list[str] = []
        try:
            out.append((compose.compose(config_file, over, notes=notes, vary=vary), notes, None))
        except UserError as e:
            out.append((None, notes, (e.message, e.hint)))
            break
    return out


def gridded(s: SweepConfig, dims: Sequence[Dimension]) -> bool:
    """Whether the sweep's trials are the grid's points: a grid sampler's, also PBT's population
    when every searched key is a list (as written); with an interval, PBT draws it at random."""
    if s.scheduler == "pbt":
        return s.sampler == "grid" and all(d.values is not None for d in dims)
    return s.sampler == "grid"


_COMPOSED: dict[tuple[str | None, tuple[str, ...]], Config] = {}


def _compose(
    config_file: str | None,
    overrides: list[str],
    notes: list[str] | None = None,
    vary: Sequence[str] = (),
) -> Config:
    """compose.compose, once per point in this process: a grid's points are composed to check
    them before the sweep starts, and again for each trial, a second or more on a small machine
    (trials waited on it). The -C file cannot change in between (its digest is checked). A
    point's overrides name each key once, so their order does not matter."""
    key = _key(config_file, overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = compose.compose(config_file, overrides, notes=notes, vary=vary)
    return _COMPOSED[key]


def _key(config_file: str | None, overrides: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    where = str(Path(config_file).absolute()) if config_file else None  # sweep.json's form
    return where, tuple(sorted(overrides))


def _overrides(plain: list[str], point: dict[str, Any]) -> list[str]:
    return [*plain, *(_override(k, v) for k, v in point.items())]


def _group_options(config_file: str | None, group: str) -> list[str] | None:
    """The options of a config group, what ``glob()`` picks from (None: not a group)."""
    if group not in (*layers.GROUPS, layers.PRESETS):
        return None
    dirs = [Path(config_file).expanduser().resolve().parent] if config_file else []
    return layers.group_options(group, dirs)


@dataclass
class Outcome:
    """How a sweep (or its resume) ended, from its ledger; `failed` counts failed and lost trials."""

    sweep_dir: Path
    trials: int
    failed: int


def new_sweep_dir(root: Path, name: str | None = None) -> Path:
    """Create a fresh sweep directory atomically (two sweeps never share one):
    NAME-sweep-TIME-XXXX, or sweep-TIME-XXXX without a name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = f"{name}-sweep" if name else "sweep"
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o750)
        for _ in range(100):
            path = root / f"{prefix}-{stamp}-{secrets.token_hex(2)}"
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
    config_file: str | None, overrides: Sequence[str], repeat: int | None = None
) -> Outcome:
    """`expctl run -m`: validate, create the sweep and its study, then run (or submit) trials."""
    notes: list[str] = []
    pool: Pool | None = None

    def start_forker(base: Config) -> None:  # it imports torch while the sweep is made
        nonlocal pool
        if base.launcher.name != "slurm":
            from expctl.sweep import trials  # lazy: `sweep table` never needs it

            pool = trials.forker()

    try:
        # every point is valid before anything exists
        space = plan(config_file, overrides, notes, start_forker)
        local = space.base.launcher.name != "slurm"
        return _multirun(config_file, overrides, space, notes, repeat, pool if local else None)
    finally:
        if pool is not None:
            pool.close()


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
    repeat = s.repeat if repeat is None else repeat
    size = len(points) if gridded(s, dims) else s.n_trials or DEFAULT_TRIALS
    _check_size(size, repeat)
    if s.scheduler == "pbt":
        pbt.check(base, [d.key for d in dims], repeat)
        if size < 2:
            raise UserError(
                f"sweep.scheduler=pbt with a population of {size}: a trial copies another's "
                "weights and values, and none is there",
                "give it two or more: sweep.n_trials=4, or a list of two or more values",
            )
    if base.launcher.name != "slurm":  # a share this machine cannot give: before anything exists
        from expctl.sweep import trials  # lazy: it counts GPUs with torch

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


def _digest(config_file: str | None) -> str | None:
    """The SHA-256 of the -C file's text (None without one, or when it is gone)."""
    import hashlib

    if config_file is None:
        return None
    try:
        return hashlib.sha256(Path(config_file).read_bytes()).hexdigest()
    except OSError:
        return None


def _check_unchanged(spec: dict[str, Any]) -> None:
    """A sweep's trials all come from the -C file as it was when the sweep started."""
    if _digest(spec["config_file"]) != spec.get("config_sha256", _digest(spec["config_file"])):
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
        if slot.params:
            study.enqueue_trial(slot.params, skip_if_exists=False)
        trial = study.ask({d.key: d.distribution() for d in dims})
        chosen = dict(trial.params)
        overrides = [*spec["plain"], *(_override(k, v) for k, v in chosen.items())]
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
            cfg = _compose(spec["config_file"], overrides, vary=vary)
            cfg = cfg.replace("run", dir=str(trial_dir))
        if slot.retry:  # a retry continues the failed trial's own checkpoints
            cfg = cfg.replace("checkpoint", resume="auto")
        frozen, held = rundir.create(cfg)
        if held is not None:  # the trial's launch takes it when it starts
            held.release()
        TrialRef(str(sweep_dir), trial.number).write(trial_dir)  # the attempt's identity
        out.append(frozen)
    return out


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
        from expctl.jobs import launch  # lazy: it loads torch, which `sweep table` never needs

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
    from expctl.sweep import (
        trials,  # lazy: it counts GPUs with torch, which `sweep table` never needs
    )

    use = trials.plan_for(base, len(todo))

    study = open_study(sweep_dir, base.sweep)

    def make_config(slot: Slot) -> Config:
        (cfg,) = _trial_configs(sweep_dir, base, [slot], study)
        return trials.with_share(cfg, use.share)

    trials.run_local(sweep_dir, use, todo, make_config, origin, base.sweep, pool)
    print(results.table(sweep_dir))
    if any(r.status == "completed" for r in ledger.rows(sweep_dir)):
        print(_best_line(ledger.best(sweep_dir)), flush=True)
    return _outcome(sweep_dir)


def _best_line(top: Best) -> str:
    """The end-of-sweep summary of `ledger.best`: with repeats, the mean ± std over the seeds of
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
    import statistics

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
    from expctl.jobs.exploit import continue_as_copy  # torch: checkpoints
    from expctl.jobs.study import attrs_of, mark

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


def resume(sweep_dir: str | Path) -> Outcome:
    """Re-run the trials that failed or were lost (in their own directories, resuming their
    checkpoints), and the ones the sweep never got to."""
    import optuna

    path = Path(sweep_dir).absolute()
    if not SweepDir(path).spec.is_file():
        raise UserError(
            f"{path}: not a sweep directory (no {SweepDir.SPEC})",
            "pass the folder `expctl run -m` printed",
        )
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
        if r.status in ledger.UNFINISHED:
            assert r.optuna_trial is not None, "a trial that ended was started"
            study.tell(r.optuna_trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx, True, r.lineage))
        elif r.optuna_trial is None:  # never started
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx))
    if not todo:
        print(f"expctl: nothing to resume in {path}: every trial completed or was stopped")
        return _outcome(path)
    print(f"expctl: resuming {len(todo)} trial(s) of {path}", flush=True)
    return run_trials(path, base, todo, Launch.here(spec["config_file"]).pin())
