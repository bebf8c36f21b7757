"""A component's arguments as the config sees them, read from its factory's signature:
`check_args` (an unknown, missing or mistyped argument is a UserError, with a did-you-mean),
which parameters a YAML value can set (`settable`, `annotation_options`), and the arguments
`expctl list` shows (`describe`). The factories themselves are found in `registry.py`.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Mapping
from typing import Any

from expctl.errors import UserError, choices_text, did_you_mean
from expctl.registry import Entry, canonical_kind, get


def check_args(kind: str, name: str, kwargs: Mapping[str, Any], section: str) -> None:
    """Check config arguments against the factory's signature, before anything is built.

    Raises:
        UserError: unknown argument (with did-you-mean), missing required one, or wrong type.
    """
    entry = get(kind, name)
    params = entry.parameters()
    for key, value in kwargs.items():
        if key not in params:
            if entry.accepts_any():
                continue
            raise UserError(
                f"{section}.{key}: '{name}' has no argument '{key}'.{did_you_mean(key, params)} "
                f"Valid: {choices_text(params) or '(none)'}",
                f"see `expctl list {canonical_kind(kind)}` for the arguments of '{name}'",
            )
        if value is None and entry.defers(key):
            continue
        if value == "???":
            continue  # required: reported below
        if key in getattr(entry.check, "owns", ()):
            continue  # its check says more than the type (`builtin.checks.owns`)
        _check_type(f"{section}.{key}", value, params[key])
    for p in params.values():
        unset = p.name not in kwargs or kwargs[p.name] == "???"
        if p.default is p.empty and unset and p.name not in entry.inferred:
            raise UserError(
                f"{section}: '{name}' needs argument '{p.name}', which the config does not set",
                f"add it, e.g. {section}.{p.name}=VALUE on the command line",
            )
    if entry.check is not None:
        entry.check(**kwargs)


def describe(entry: Entry) -> str:
    """Render 'arg=default, arg: type' for `expctl list` (only what a YAML value can set)."""
    parts = []
    for p in entry.parameters().values():
        if not settable(p):
            continue  # a class or function argument (e.g. torchvision's norm_layer)
        ann = _annotation_name(p)
        text = p.name + (f": {ann}" if ann else "")
        if p.default is not p.empty:
            text += f" = {p.default!r}"
        parts.append(text)
    if entry.accepts_any() and entry.params_of is None:
        parts.append("**kwargs")
    return ", ".join(parts)


def settable(p: inspect.Parameter) -> bool:
    """Whether a YAML value can set the parameter: its annotation admits a plain value, not
    only a class, function, module or tensor (``lr: float | Tensor`` can be set)."""
    options = annotation_options(p)
    if not options:
        return True
    unsettable = re.compile(r"\b(Callable|Module|Tensor|Type|type)\b")
    return any(o != "None" and not unsettable.search(o) for o in options)


def _annotation_name(p: inspect.Parameter) -> str:
    ann = p.annotation
    if ann is p.empty:
        return ""
    if isinstance(ann, type):
        return ann.__name__
    return str(ann).replace("typing.", "").replace("torch.", "")


_SIMPLE = {"int": int, "float": float, "bool": bool, "str": str}
NEVER_FROM_YAML = {"Tensor"}
_SEQUENCE = re.compile(r"^(?:[\w.]+\.)?(Sequence|list|List|tuple|Tuple)\[")


def annotation_options(p: inspect.Parameter) -> list[str]:
    """The alternatives of a parameter's annotation: 'Optional[float]' -> ['float', 'None']."""
    text = _annotation_name(p)
    if not text:
        return [type(p.default).__name__] if p.default not in (p.empty, None) else []
    m = re.fullmatch(r"Optional\[(.*)\]", text)
    if m:
        text = m.group(1) + " | None"
    m = re.fullmatch(r"Union\[(.*)\]", text)
    if m and "[" not in m.group(1):
        text = m.group(1).replace(",", "|")
    return [o.strip() for o in text.split("|")]


def _check_type(where: str, value: Any, p: inspect.Parameter) -> None:
    """Check `value` against a simple annotation (int, float, bool, str, unions of them)."""
    options = annotation_options(p)
    if options and all(_SEQUENCE.match(o) or o == "None" for o in options):
        if isinstance(value, (list, tuple)) or (value is None and "None" in options):
            return  # the items: the factory checks them
        raise UserError(
            f"{where}: expected a list ({' or '.join(options)}), got {value!r}",
            f"write it as a list, e.g. {where}=[{json.dumps(value, default=str)}]",
        )
    if not options or any(
        o not in _SIMPLE and o != "None" and o not in NEVER_FROM_YAML for o in options
    ):
        return  # user types: the factory checks them
    if value is None and "None" in options:
        return
    if value is not None and any(_fits(value, _SIMPLE[o]) for o in options if o in _SIMPLE):
        return
    shown = " or ".join(o for o in options if o not in NEVER_FROM_YAML)
    raise UserError(
        f"{where}: expected {shown}, got {value!r} ({type(value).__name__})",
        f"set {where} to a value of type {shown.split(' or ')[0]}",
    )


def _fits(value: Any, t: type) -> bool:
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)
