"""Checks of component arguments that need no torch: the catalogue (catalogue.py) calls them by
name for a described component, so `expctl show` checks `optim.lr=1e308` without importing the
module that registered the optimizer (which imports torch). Mark such a check `@light`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from expctl.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])
FLOAT32_MAX = 3.4028234663852886e38


def light(check: F) -> F:
    """Mark a module-level check function as importable without torch (its module imports
    none): a described entry calls it as `module:qualname`."""
    check.light = True  # type: ignore[attr-defined]
    return check


def owns(*keys: str) -> Callable[[F], F]:
    """Mark a check as the one that checks arguments `keys` whole, their type included: the
    signature check leaves them to it, so its error can say what the value stands for (one
    value per image channel) rather than only its type."""

    def mark(check: F) -> F:
        check.owns = frozenset(keys)  # type: ignore[attr-defined]
        return check

    return mark


def _numbers(section: str, args: dict[str, object]) -> Iterator[tuple[str, float]]:
    """(key, number) of every number among a component's arguments (in lists too: betas)."""
    for key, value in args.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(items):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                where = f"{section}.{key}" + (f"[{i}]" if items is value else "")
                yield where, v


@light
def optimizer(**args: object) -> None:
    """Numbers the update multiplies float32 parameters by: torch computes with them in the
    parameters' dtype, where 1e308 overflows in the first step. Then what torch's optimizers
    refuse when built (an IndexError for one beta): betas, negative rates."""
    for where, v in _numbers("optim", args):
        if abs(v) > FLOAT32_MAX:
            raise UserError(
                f"{where}={v:g}: beyond float32's range (3.4e+38), the type the update is "
                "computed in: the first step would overflow",
                f"set {where} to a value a model can train with, e.g. optim.lr=0.01",
            )
    betas = args.get("betas")
    if betas is not None and (
        not isinstance(betas, (list, tuple))
        or len(betas) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in betas)
    ):
        raise UserError(
            f"optim.betas={betas}: two numbers, the decay rates of the gradient's first and "
            "second moments",
            "e.g. optim.betas=[0.9,0.999]",
        )
    if betas is not None and not all(0 <= b < 1 for b in betas):
        raise UserError(
            f"optim.betas={betas}: each from 0 up to (not including) 1",
            "e.g. optim.betas=[0.9,0.999]",
        )
    for key in ("lr", "eps", "weight_decay", "momentum"):  # what torch's optimizers refuse
        value = args.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise UserError(
                f"optim.{key}={value:g}: negative; torch's optimizers take {key} >= 0",
                f"set optim.{key} to 0 or more",
            )


@light
def model(**args: object) -> None:
    """A built-in model's sizes (widths, hidden layers, classes, channels) are at least 1 and a
    dropout is a probability: a width of 0 builds, then fails in C++ at the first step."""
    for key, value in args.items():
        if "dropout" in key and isinstance(value, (int, float)) and not 0 <= value <= 1:
            raise UserError(
                f"model.{key}={value}: a probability, from 0 to 1",
                f"e.g. model.{key}=0.1 (0: none)",
            )
    for where, v in _numbers("model", args):
        if isinstance(v, int) and "dropout" not in where and v < 1:
            raise UserError(
                f"{where}={v}: a size of the model, at least 1",
                f"e.g. {where}=32, or leave it out for the default",
            )


@light
def loss(**args: object) -> None:
    """What torch's losses check only at the first batch, in C++: integers (ignore_index) are
    64-bit, label_smoothing is a fraction."""
    for where, v in _numbers("loss", args):
        if isinstance(v, int) and not -(2**63) <= v < 2**63:
            raise UserError(
                f"{where}={v}: outside the 64-bit integers torch takes",
                f"set {where} to a class index (or the default)",
            )
    smoothing = args.get("label_smoothing")
    if isinstance(smoothing, (int, float)) and not 0 <= smoothing <= 1:
        raise UserError(
            f"loss.label_smoothing={smoothing}: not between 0 and 1",
            "the share of the target spread over the other classes, e.g. loss.label_smoothing=0.1",
        )


GPT_POSITIONS = ("rotary", "learned")


@light
def gpt(
    vocab_size: int | None = None,
    block_size: int | None = None,
    n_layer: int = 1,
    n_head: int = 1,
    d_model: int = 1,
    pos: str = "rotary",
    dropout: float = 0.0,
    **_: object,
) -> None:
    """model=gpt's sizes: whole heads (of an even width for rotary positions), positive sizes,
    a dropout probability; vocab_size and block_size null are the data's."""
    sizes = {"vocab_size": vocab_size, "block_size": block_size}
    sizes.update(n_layer=n_layer, n_head=n_head, d_model=d_model)
    for key, value in sizes.items():
        if value is not None and value < 1:
            raise UserError(f"model.{key}={value}: must be at least 1", f"set model.{key} >= 1")
    if pos not in GPT_POSITIONS:
        raise UserError(
            f"model.pos={pos!r} is not one of: {', '.join(GPT_POSITIONS)}",
            "set model.pos=rotary (rotary embeddings) or model.pos=learned (GPT-2's)",
        )
    if d_model % n_head or (pos == "rotary" and (d_model // n_head) % 2):
        even = " and even (rotary positions rotate pairs)" if pos == "rotary" else ""
        raise UserError(
            f"model.d_model={d_model} over model.n_head={n_head} heads: each head's width must "
            f"be whole{even}",
            "pick d_model a multiple of n_head, e.g. model.d_model=768 model.n_head=12",
        )
    if not 0 <= dropout < 1:
        raise UserError(f"model.dropout={dropout}: not in [0, 1)", "e.g. model.dropout=0.1")


def split_form(val_split: int | float) -> None:
    """data.val_split: 0 (none), a count of samples (an integer >= 1) or a fraction (a float
    between 0 and 1, both excluded); `carve` checks it against the number of samples once they
    are read. A float is never a count: ``1.0`` is almost surely a fraction mistaken."""
    count = isinstance(val_split, int) and val_split >= 1
    fraction = isinstance(val_split, float) and 0 < val_split < 1
    if val_split == 0 or count or fraction:
        return
    raise UserError(
        f"data.val_split={val_split!r}: neither a count of samples (an integer >= 1) nor a "
        "fraction of them (a float between 0 and 1, both excluded)",
        f"a count is written without a point: data.val_split={int(val_split)}; a fraction is "
        "below 1, e.g. data.val_split=0.1 (a tenth of the training samples)"
        if isinstance(val_split, float) and val_split >= 1 and val_split.is_integer()
        else "e.g. data.val_split=0.1 (a tenth of the training samples), data.val_split=5000 "
        "(5000 of them), or 0 for no split",
    )
