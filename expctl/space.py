"""The search space of `expctl run -m`: Hydra's multirun grammar (``a=1,2``, ``range()``,
``choice()``, ``interval()``, ``tag(log, ...)``), parsed by Hydra's own override parser, into
plain overrides and swept dimensions; the grid of their points."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from expctl.errors import UserError
from expctl.explain import parse_override


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
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.values is not None:
            return CategoricalDistribution(self.values)
        assert self.low is not None and self.high is not None
        if self.integer:
            return IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


def parse_space(overrides: Sequence[str]) -> tuple[list[str], list[Dimension]]:
    """Split overrides into plain ones and swept dimensions (Hydra's override grammar)."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    plain: list[str] = []
    dims: list[Dimension] = []
    for text in overrides:
        o = parse_override(text)
        if not o.is_sweep_override():
            plain.append(text)
            continue
        key, value = o.get_key_element(), o.value()
        if isinstance(value, ChoiceSweep):
            dims.append(Dimension(key, values=[_text(v) for v in value.list]))
        elif isinstance(value, RangeSweep):
            start, stop, step = (
                float(value.start or 0),
                float(value.stop or 0),
                float(value.step or 1),
            )
            values: list[Any] = []
            x = start
            while (step > 0 and x < stop) or (step < 0 and x > stop):
                values.append(x)
                x += step
            if all(isinstance(v, int) for v in (value.start, value.stop, value.step)):
                values = [int(v) for v in values]
            dims.append(Dimension(key, values=[_text(v) for v in values]))
        elif isinstance(value, IntervalSweep):
            dims.append(_interval(text, key, value))
        else:
            raise UserError(
                f"{text}: {type(value).__name__} is not supported in sweeps",
                "use a,b / range() / choice() / interval()",
            )
    return plain, dims


def _interval(text: str, key: str, value: Any) -> Dimension:
    """The Dimension of an interval(low, high) sweep, its bounds checked before anything exists."""
    low, high = float(value.start or 0), float(value.end or 0)
    log = "log" in value.tags
    if not low < high:
        raise UserError(
            f"{text}: interval({low:g}, {high:g}) needs low < high",
            f"e.g. {key}=interval({min(low, high):g},{max(low, high):g})",
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


def _text(value: Any) -> str:
    """A swept value as Hydra override text: grid points and categorical choices are kept in
    this form (Optuna stores only primitive choices; `[16, 16]` or `'a b'` stay intact)."""
    from hydra.core.override_parser.types import Transformer  # what Hydra's sweepers use

    return Transformer.str(value)
