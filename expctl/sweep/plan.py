"""A sweep's plan: the search space of `expctl run -m` over the composed config, and every grid
point composed (so checked) before the sweep exists; `compose_point` composes a point once per
process, for the plan and again for its trial (`multirun.py` drives the sweep).
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl import dist
from expctl.config import compose, layers
from expctl.config.schema import Config, SweepConfig
from expctl.errors import UserError
from expctl.jobs import pbt
from expctl.sweep.space import MAX_VALUES, Dimension, check_values, grid, parse_space


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
    first: list[str]  # the overrides `base` was composed with


def plan(
    config_file: str | None,
    overrides: Sequence[str],
    notes: list[str],
) -> Plan:
    """The sweep of `expctl run -C config_file -m overrides`, every grid point composed (so
    valid) before anything is created.

    The search space is Hydra's: the config's ``sweep.params``, then the command line, the last
    value of a key winning (defaults < config file < command line); ``shuffle()`` draws from
    ``sweep.seed``. `notes` receives compose's notes (settings an override set aside).
    """
    options = functools.partial(_group_options, config_file)
    plain, dims = parse_space(overrides, options=options)
    first = point_overrides(plain, {d.key: d.values[0] for d in dims if d.values})
    # the sweep's own settings (sweep.params, seed, sampler) come from a composed config
    base = compose_point(config_file, first, notes)
    s = base.sweep
    plain, dims = parse_space(overrides, s.params, s.seed, options)
    check_values(dims)
    points = grid(dims) if gridded(s, dims) else []
    if s.n_trials and len(points) > s.n_trials:
        notes.append(
            f"sweep.n_trials={s.n_trials} runs the first {s.n_trials} of the grid's "
            f"{len(points)} points (without sweep.n_trials, all of them)"
        )
        points = points[: s.n_trials]
    _check_run_dir(overrides)
    if base.run.dir is not None:  # a frozen run's config.yaml as -C, say
        notes.append(
            f"run.dir={base.run.dir} of the -C file names one run's folder: the sweep makes its "
            f"own under run.root={base.run.root}"
        )
    if "loss" in s.metric and s.mode == "max":
        notes.append(
            f"sweep.metric={s.metric} with sweep.mode=max: the best trial is the one with the "
            "highest loss (sweep.mode=min for a loss)"
        )
    heads = points or [{d.key: d.values[0] for d in dims if d.values}]
    over = point_overrides(plain, heads[0])
    if over != first:  # sweep.params or a shuffle moved the first point
        base = compose_point(config_file, over, notes)
    others = [point_overrides(plain, point) for point in heads[1:]]
    vary = [d.key for d in dims]
    for d in dims:  # an interval's ends are values a trial (or a PBT mutation) may get
        for end in (d.low, d.high) if d.values is None else ():
            value = round(end) if d.integer and end is not None else end
            others.append(point_overrides(plain, {**heads[0], d.key: value}))
            if not d.integer:
                _floats_fit(config_file, others[-1], notes, d)
    if len(others) >= _SAY_AT:  # seconds to minutes: say what the wait is
        print(
            f"expctl: checking the grid's {len(others) + 1:,} points before the sweep starts "
            "(each composed once)",
            file=sys.stderr,
            flush=True,
        )
    _compose_all(config_file, others, notes, vary)
    return Plan(base, plain, dims, points, over)


_SAY_AT = 500  # points composed (~0.07 s each a core) before the wait is said


def _floats_fit(
    config_file: str | None, overrides: list[str], notes: list[str], d: Dimension
) -> None:
    """An interval draws floats (Hydra's): on an integer key, say so, and how to draw integers
    (the composer said only "expected int, got '1.0'")."""
    try:
        compose_point(config_file, overrides, notes, [d.key])
    except UserError as e:
        if "expected int" not in e.message:
            raise
        lo = math.ceil(d.low or 0)  # the integers inside the bounds (at least two)
        hi = max(lo + 1, math.floor(d.high or 0))
        raise UserError(
            f"{d.key}=interval({d.low:g},{d.high:g}) draws floats, and {d.key} takes integers",
            f"draw integers with {d.key}='tag(int, interval({lo},{hi}))', or list them "
            f"({d.key}=range({lo},{hi + 1}))",
        ) from None


def _compose_all(
    config_file: str | None, todo: list[list[str]], notes: list[str], vary: list[str]
) -> None:
    """Compose every override list of `todo` (which differ in the values of `vary`'s keys) into
    the cache, the first bad one raising. A point takes ~0.07 s of one core (~0.3 s when Hydra
    composes it whole: a component or a preset varies), so a large grid is composed by forked
    copies of this process (its imports and first composition done) on the cores it may use."""
    todo = [o for o in todo if _key(config_file, o) not in _COMPOSED]
    if todo:  # Hydra's composition of what the points share, made once, before any fork
        compose_point(config_file, todo.pop(0), notes, vary)
    workers = min(dist.usable_cores(), len(todo) // _PER_WORKER)
    if workers < 2 or threading.active_count() > 1:  # a fork copies other threads' locks held
        for over in todo:
            compose_point(config_file, over, notes, vary)
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


def compose_point(
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


def point_overrides(plain: list[str], point: dict[str, Any]) -> list[str]:
    return [*plain, *(_override(k, v) for k, v in point.items())]


def _group_options(config_file: str | None, group: str) -> list[str] | None:
    """The options of a config group, what ``glob()`` picks from (None: not a group)."""
    if group not in (*layers.GROUPS, layers.PRESETS):
        return None
    dirs = [Path(config_file).expanduser().resolve().parent] if config_file else []
    return layers.group_options(group, dirs)


# ---------------------------------------------------------------------------------------------
# checks of a sweep before anything exists (that its files stay as they were: unchanged.py)
# ---------------------------------------------------------------------------------------------


def _check_run_dir(overrides: Sequence[str]) -> None:
    """run.dir names one run's folder; a sweep makes its own (under run.root, named by
    run.name), each trial in it (a -C file's run.dir, a frozen run's, is left aside).

    Raises:
        UserError: the command line sets run.dir.
    """
    given = [o for o in overrides if o.lstrip("+~").partition("=")[0] == "run.dir"]
    if given:
        raise UserError(
            f"{given[-1]} with -m: a sweep makes its own directory, one folder per trial in it",
            "say where it goes with run.root=DIR (and run.name=NAME), or drop -m to train one run",
        )


def check_sweep(
    base: Config, dims: Sequence[Dimension], points: list[dict[str, Any]], repeat: int, size: int
) -> list[str]:
    """Before anything exists: what the sweep `base` of `size` trials (`points`: its grid)
    cannot run as written, refused; notes on what it runs otherwise than one may think."""
    s = base.sweep
    check_size(size, repeat)
    check_dims(dims, repeat)
    swept = {d.key for d in dims}
    for entry in base.train.hparam_schedule:  # its values win over a trial's from their step
        for key in sorted(
            swept & {f"{sec}.{k}" for sec, v in entry.items() if isinstance(v, dict) for k in v}
        ):
            raise UserError(
                f"train.hparam_schedule sets {key} from step {entry.get('step')}, and the sweep "
                f"varies {key}: every trial would train with the schedule's value",
                f"drop {key} from train.hparam_schedule, or sweep another key",
            )
    notes = []
    if s.n_trials and points and s.n_trials > len(points):
        notes.append(
            f"sweep.n_trials={s.n_trials} is more than the grid's {len(points)} point(s): it runs each once"
        )
    if s.scheduler != "pbt":  # (a population may start from one point twice: it mutates)
        return notes + said_twice(points, dims, size, s.sampler)
    pbt.check(base, [d.key for d in dims], repeat)
    if size < 2:
        raise UserError(
            f"sweep.scheduler=pbt with a population of {size}: a trial copies another's "
            "weights and values, and none is there",
            "give it two or more: sweep.n_trials=4, or a list of two or more values",
        )
    if not points and s.n_trials is None:
        notes.append(f"a population of {size} drawn at random (sweep.n_trials sets how many)")
    if not points and s.sampler not in ("random", "grid"):
        notes.append(f"PBT draws its population at random: sweep.sampler={s.sampler} is not used")
    return notes


def check_size(configurations: int, repeat: int) -> None:
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


def check_dims(dims: Sequence[Dimension], repeat: int) -> None:
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
                f"train.seed is swept and --repeat {repeat} (or sweep.repeat) adds seeds to each "
                "point: trials would train with the same seed",
                "sweep train.seed alone (train.seed=range(0,N)), or repeat without it",
            )


def said_twice(
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
