"""Population Based Training (`sweep.scheduler=pbt`), as Ray Tune's PopulationBasedTraining does it.

A population of trials trains side by side. Every `sweep.pbt.interval` validations a trial
compares its latest score with the other running trials' (`decide`): in the bottom quantile, it
stops there and continues as a copy of a top-quantile trial: that trial's checkpoint of the
weights compared (weights, optimizer, scheduler, RNG, data position) becomes its own (`transplant`) and its
hyperparameters are perturbed or drawn anew (`explore`). The rank knows none of this: a trial is
a run that reports (trialhooks.TrialHooks); a copy is a restart from a checkpoint with new values,
whose optimizer and loss values take effect through `train.hparam_schedule` (trialprocess.py
makes the copy; this module imports no torch: `sweep table` reads lineages).

Each copy is recorded in the trial's lineage: `{"step", "from_trial", "params", "time"}`. The
lineage of the trials makes the hyperparameter schedule that produced a trial's weights
(`timeline`): `sweep best` writes it, and training it from the start replays the trial.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from expctl.config.explain import parse_override
from expctl.config.schema import DEFAULT_EPOCHS, HPARAM_SECTIONS, Config, PBTConfig
from expctl.errors import UserError
from expctl.layout import RunDir, checkpoint_set, checkpoint_step

FROZEN = "pbt"  # RUN_DIR/pbt/: the donor's checkpoint, linked when the trial decided to copy it


def check(cfg: Config, keys: Sequence[str], repeat: int) -> None:
    """What PBT needs, before the sweep starts: every swept key an optimizer or loss argument
    (what can change mid-run), no pruner, one seed, and a local launcher.

    Raises:
        UserError: naming the key or setting that cannot be.
    """
    s = cfg.sweep
    if s.pruner != "none":
        raise UserError(
            f"sweep.scheduler=pbt with sweep.pruner={s.pruner}: PBT decides itself which trials "
            "go on (the weak ones continue from strong ones)",
            "drop sweep.pruner",
        )
    epochs = cfg.train.max_epochs or DEFAULT_EPOCHS
    if cfg.train.max_steps is None and s.pbt.interval >= epochs:
        raise UserError(
            f"sweep.pbt.interval={s.pbt.interval} with train.max_epochs={epochs}: trials "
            "compare every interval epochs, never at the last, so none ever would",
            f"sweep.pbt.interval={max(1, epochs // 4)} (or more epochs)",
        )
    if cfg.train.hparam_schedule:
        raise UserError(
            "sweep.scheduler=pbt with train.hparam_schedule: PBT writes the schedule itself (a "
            "copy's values from its step), and would drop yours",
            "drop train.hparam_schedule (PBT's values are the schedule)",
        )
    if repeat > 1:
        raise UserError(
            f"sweep.scheduler=pbt with --repeat {repeat}: a population shares one seed (a copy "
            "continues another trial's data order)",
            "drop --repeat / sweep.repeat",
        )
    lc = cfg.launcher
    tasks = lc.nodes * (lc.tasks_per_node or lc.gpus_per_node or 1)
    if lc.name == "slurm" and tasks > 1:
        raise UserError(
            f"sweep.scheduler=pbt on Slurm runs each trial as one task (this trial: {tasks} tasks "
            f"on launcher.nodes={lc.nodes}): a trial continues as a copy inside its job",
            "launcher.nodes=1 launcher.gpus_per_node=1, or run the sweep inside an allocation "
            "with launcher=local",
        )
    if not keys:
        raise UserError(
            "sweep.scheduler=pbt needs a search space: what may mutate",
            "e.g. expctl run -m sweep.scheduler=pbt 'optim.lr=tag(log, interval(1e-4, 1e-1))'",
        )
    for key in keys:
        section, _, arg = key.partition(".")
        if section not in HPARAM_SECTIONS or not arg or arg == "name" or "." in arg:
            raise UserError(
                f"sweep.scheduler=pbt cannot mutate {key}: only optimizer and loss arguments "
                "change mid-run (optim.lr, optim.momentum, optim.weight_decay, "
                "loss.label_smoothing, ...)",
                f"sweep {key} without PBT (sweep.scheduler=none), or keep it fixed",
            )
        if key == "optim.lr" and cfg.sched.name is not None:
            raise UserError(
                f"sweep.scheduler=pbt mutates optim.lr, which sched={cfg.sched.name} sets too",
                "use sched=none: PBT's learning rate is its own schedule",
            )
    q = s.pbt.quantile
    if not 0 < q <= 0.5:
        why = (
            "no trial would be in the bottom fraction, so none would ever copy"
            if q <= 0
            else "the bottom and top fractions must not overlap"
        )
        raise UserError(f"sweep.pbt.quantile={q:g}: {why}", "use a value in (0, 0.5], e.g. 0.25")
    if not s.pbt.factors:
        raise UserError(
            "sweep.pbt.factors=[]: explore needs at least one factor to multiply a value by",
            "e.g. sweep.pbt.factors=[0.8,1.2]",
        )
    if any(not math.isfinite(f) or f <= 0 for f in s.pbt.factors):
        raise UserError(
            f"sweep.pbt.factors={list(s.pbt.factors)}: perturbation factors must be positive",
            "e.g. sweep.pbt.factors=[0.8,1.2]",
        )
    if all(f == 1 for f in s.pbt.factors):
        raise UserError(
            f"sweep.pbt.factors={list(s.pbt.factors)} never changes a number: a copy would train "
            "on as its donor does, step for step",
            "e.g. sweep.pbt.factors=[0.8,1.2]",
        )


def decide(
    me: int, scores: Mapping[int, float], quantile: float, mode: str, rng: random.Random
) -> int | None:
    """The trial `me` copies, or None: a random one of the top quantile when `me` is in the bottom
    one, ranked by the latest scores of the running trials (Ray Tune's `_quantiles`)."""
    if me not in scores or len(scores) < 2:
        return None
    sign = 1.0 if mode == "max" else -1.0

    def key(n: int) -> float:
        v = scores[n]
        return sign * v if math.isfinite(v) else -math.inf  # NaN: the worst

    order = sorted(scores, key=lambda n: (key(n), n))  # worst first
    k = math.ceil(len(order) * quantile)
    k = min(k, len(order) // 2)
    if k == 0 or me not in order[:k]:
        return None
    return rng.choice(order[-k:])


def explore(
    params: Mapping[str, Any], dims: Sequence[Mapping[str, Any]], p: PBTConfig, rng: random.Random
) -> dict[str, Any]:
    """New values from `params`: each drawn anew with `p.resample_probability`, else a listed
    value moved to a neighbour, a number multiplied by one of `p.factors` (kept in its interval).
    A number at an end of its interval moves the way it can (kept there, a copy would train
    exactly as its donor: the same weights, values and data order); a listed value at an end of
    its list stays there half the time, as in Ray Tune (with two values, moving inward would
    always take the donor's other one)."""
    out = dict(params)
    for d in dims:
        key, value = d["key"], params[d["key"]]
        choices = [_typed(v) for v in d["values"]] if d.get("values") is not None else None
        if rng.random() < p.resample_probability:
            out[key] = _sample(d, choices, rng)
        elif choices is not None:
            i = choices.index(value) if value in choices else 0
            out[key] = choices[min(len(choices) - 1, max(0, i + rng.choice((-1, 1))))]
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            factors = list(p.factors)
            first = rng.choice(factors)
            moved = [x for f in [first, *factors] if (x := _scaled(value, f, d)) != value]
            out[key] = moved[0] if moved else value
    return out


def _scaled(value: float, factor: float, d: Mapping[str, Any]) -> float:
    """`value` x `factor`, kept in the interval of dimension `d` (rounded on an integer one)."""
    x = min(float(d["high"]), max(float(d["low"]), value * factor))
    return round(x) if d.get("integer") else x


def _sample(d: Mapping[str, Any], choices: list[Any] | None, rng: random.Random) -> Any:
    if choices is not None:
        return rng.choice(choices)
    low, high = float(d["low"]), float(d["high"])
    if d.get("integer"):
        return rng.randint(int(low), int(high))
    if d.get("log"):
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def _typed(text: Any) -> Any:
    return parse_override(f"k={text}").value() if isinstance(text, str) else text


def typed(params: Mapping[str, Any]) -> dict[str, Any]:
    """Swept values as Python values (the ledger keeps Hydra override text: `0.01`, `[8]`)."""
    return {k: _typed(v) for k, v in params.items()}


def rng_for(seed: int, trial: int, step: int) -> random.Random:
    """The random stream of one decision: the same sweep seed, trial and step, the same draws."""
    return random.Random(f"pbt-{seed}-{trial}-{step}")


def freeze(donor: Path, mine: Path, step: int | None = None) -> Path | None:
    """Link the donor's checkpoint of `step` (the weights compared: it is written before their
    score is told; None: its newest), with its checksum and scores, into MINE/pbt/, where the
    donor's pruning cannot take it; None when there is none (the donor moved on and pruned it:
    other weights than those compared are never copied)."""
    folder = mine / FROZEN
    folder.mkdir(exist_ok=True)
    for _ in range(5):  # the donor may prune the one listed before it is linked: list again
        files = RunDir(donor).checkpoint_files()
        if step is not None:
            files = [f for f in files if checkpoint_step(f) == step]
        if not files:
            return None
        src = files[0]
        dst = folder / f"from_{donor.name}_{src.name}"
        try:
            for a, b in zip(checkpoint_set(src), checkpoint_set(dst), strict=True):
                b.unlink(missing_ok=True)
                if a.exists():
                    os.link(a, b)
            return dst
        except FileNotFoundError:
            continue
    return None


def entry(step: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """A `train.hparam_schedule` entry: the values of `params` ({"optim.lr": 0.1}) from `step`."""
    out: dict[str, Any] = {"step": int(step)}
    for key, value in params.items():
        section, _, arg = key.partition(".")
        out.setdefault(section, {})[arg] = list(value) if isinstance(value, tuple) else value
    return out


def timeline(
    trial: int,
    initial: Mapping[int, Mapping[str, Any]],
    lineages: Mapping[int, Sequence[Mapping[str, Any]]],
    at: float = math.inf,
) -> list[tuple[int, dict[str, Any]]]:
    """The hyperparameters that made `trial`'s weights as they were at time `at`: (step, values)
    from step 0, one item per change. A copy at time T continues the donor's own timeline as it
    stood at T (its checkpoint came from its latest segment then).

    Args:
        initial: each trial's first values; lineages: each trial's copies, oldest first.
    """
    copies = [e for e in lineages.get(trial, ()) if float(e["time"]) <= at]
    if not copies:
        return [(0, dict(initial[trial]))]
    last = copies[-1]
    before = timeline(int(last["from_trial"]), initial, lineages, float(last["time"]))
    step = int(last["step"])
    return [(s, v) for s, v in before if s < step] + [(step, dict(last["params"]))]
