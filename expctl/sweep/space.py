"""The search space of `expctl run -m`: Hydra's multirun grammar (``a=1,2``, ``range()``,
``choice()``, ``glob()``, ``shuffle()``, ``interval()``, ``tag(log, ...)``), parsed by Hydra's own
override parser into plain overrides and swept dimensions, as Hydra's BasicSweeper plans them
(tests/test_space.py compares the two on the same strings); the grid of their points."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.types import Glob, IntervalSweep, RangeSweep
from hydra.errors import HydraException

from expctl.config.explain import parse_override
from expctl.errors import UserError


@dataclass
class Dimension:
    """One swept key: the values of a grid, or an Optuna distribution."""

    key: str
    values: list[Any] | None = None  # grid / categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False
    step: float | None = None

    def distribution(self) -> Any:
        # Optuna off `run -m`'s checks: a bad sweep fails without it
        from optuna.distributions import (  # noqa: PLC0415
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.values is not None:
            return CategoricalDistribution(self.values)
        assert self.low is not None and self.high is not None
        if self.integer:
            return IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


def parse_space(
    overrides: Sequence[str],
    params: Mapping[str, str] | None = None,
    seed: int = 0,
    options: Callable[[str], list[str] | None] | None = None,
) -> tuple[list[str], list[Dimension]]:
    """Split a sweep's overrides into plain ones and swept dimensions, as Hydra's BasicSweeper
    does: `params` (the config's ``sweep.params``) first, then `overrides`; a key given twice
    keeps its first place and its last value.

    Args:
        seed: what ``shuffle()`` draws from (Hydra draws from the `random` module).
        options: a config group's options, for ``glob()`` (None: not a group).

    Returns:
        The plain overrides (as Hydra's text, parsed once: what every trial gets) and the
        dimensions, each in its key's first place. A dimension may be empty (``range(3,1)``, a
        glob that matches nothing): `check_values` says so.
    """
    texts = [*(f"{k}={v}" for k, v in (params or {}).items()), *overrides]
    state = random.getstate()
    random.seed(seed)
    try:  # parse all, then enumerate all: the order in which Hydra's shuffles draw
        parsed = [(text, parse_override(text)) for text in texts]
        by_key: dict[str, str | Dimension] = {}
        for text, o in parsed:
            key = o.key_or_group + (f"@{o.package}" if o.package else "")  # `+a=1 a=2`: a=2
            by_key[key] = (  # a key given again keeps its place (Hydra's OrderedDict)
                _dimension(text, o, options)
                if o.is_sweep_override()
                else f"{o.get_key_element()}={o.get_value_element_as_str()}"
            )
    finally:
        random.setstate(state)
    plain = [v for v in by_key.values() if isinstance(v, str)]
    return plain, [v for v in by_key.values() if isinstance(v, Dimension)]


def _dimension(text: str, o: Any, options: Callable[[str], list[str] | None] | None) -> Dimension:
    """The values of one swept key, enumerated by Hydra's own iterator (its float ranges step
    in decimal: range(0,1,0.1) ends at 0.9), or its interval."""
    key, value = o.get_key_element(), o.value()
    if isinstance(value, IntervalSweep):
        return _interval(text, key, value)
    if isinstance(value, Glob):
        names = options(o.key_or_group) if options else None
        if names is None:
            raise UserError(
                f"{text}: glob() picks among the options of a config group, and "
                f"'{o.key_or_group}' is not one",
                "e.g. model='glob(res*)' or experiment='glob(*)'; or list the values: a,b,c",
            )
        return Dimension(key, values=value.filter(names))
    if isinstance(value, RangeSweep):
        _check_range(text, key, value)
    if o.is_discrete_sweep():
        try:
            return Dimension(key, values=list(o.sweep_string_iterator()))
        except (ValueError, HydraException):  # Python's range(1,5,0), Hydra's float range
            raise UserError(
                f"{text}: range() needs a step other than 0",
                f"e.g. {key}='range(0,1,0.1)' (start, stop, step; stop is left out)",
            ) from None
    raise UserError(
        f"{text}: {type(value).__name__} is not supported in sweeps",
        "use a,b / range() / choice() / glob() / interval()",
    )


MAX_VALUES = 100_000  # of one range(): more is a typo (Hydra would list them for minutes)


def _check_range(text: str, key: str, value: Any) -> None:
    """A range() Hydra's iterator can enumerate: finite (an infinite one never ends, NaN is a
    decimal error) and of a size a sweep can run."""
    start, stop, step = (float(x) for x in (value.start, value.stop, value.step))
    if not all(math.isfinite(x) for x in (start, stop, step)):
        raise UserError(f"{text}: range() needs finite numbers", f"e.g. {key}='range(0,1,0.1)'")
    if step and (stop - start) / step > MAX_VALUES:
        raise UserError(
            f"{text}: range() lists {(stop - start) / step:.0f} values, more than {MAX_VALUES:,}",
            "check start, stop and step (range(start, stop, step)), or sample with sweep=random "
            f"and {key}='interval(low, high)'",
        )


def check_values(dims: Sequence[Dimension]) -> None:
    """Every dimension has a value to try (Hydra would plan no trial at all)."""
    for d in dims:
        if d.values == []:
            raise UserError(
                f"{d.key}: the sweep gives it no value (an empty range() or a glob() that "
                "matches nothing)",
                "range(1,5) counts up, range(5,1,-1) counts down; `expctl list` names the "
                "options a glob() picks from",
            )


def _interval(text: str, key: str, value: Any) -> Dimension:
    """The Dimension of an interval(low, high) sweep, its bounds checked before anything exists."""
    low, high = float(value.start or 0), float(value.end or 0)
    log = "log" in value.tags
    if not low < high:
        wider = f"{key}=interval({low:g},{low * 2 if low > 0 else low + 1:g})"
        raise UserError(
            f"{text}: interval({low:g}, {high:g}) needs low < high",
            f"e.g. {key}=interval({high:g},{low:g})"
            if low > high
            else f"one value: {key}={low:g}; a range, e.g. {wider}",
        )
    if log and low <= 0:
        raise UserError(
            f"{text}: a log interval needs low > 0 (got {low:g})",
            f"e.g. {key}='tag(log, interval(1e-5, {high:g}))'",
        )
    return Dimension(key, low=low, high=high, log=log, integer="int" in value.tags)


def grid(dims: list[Dimension]) -> list[dict[str, Any]]:
    """Every point of the grid, the first dimension varying slowest (Hydra's order)."""
    for d in dims:
        if d.values is None:
            raise UserError(
                f"{d.key}: interval() needs a sampler, the grid cannot enumerate it",
                "add sweep=random or sweep=tpe with sweep.n_trials=N, or list values: a,b,c",
            )
    names = [d.key for d in dims]
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*[d.values or [] for d in dims])
    ]
