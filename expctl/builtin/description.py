"""One component described without its code: its registry entry as JSON (`encode`: names,
signatures, settings) and back (`decode`: a described entry whose factory, `params_of` and check
import the module that registers it when called; a check marked `checks.light` runs without
it). `catalogue.py` keeps these descriptions in the cache folder and ships them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from expctl import registry


def encode(kind: str, entry: registry.Entry, module: str) -> dict[str, Any]:
    """What describing `entry` needs, as JSON: its signatures, not its code."""
    return {
        "kind": kind,
        "name": entry.name,
        "module": module,
        "description": entry.description,
        "factory": _spec(entry.factory),
        "params_of": None if entry.params_of is None else _spec(entry.params_of),
        "runtime": sorted(entry.runtime),
        "inferred": sorted(entry.inferred),
        "check": _check_spec(entry.check),
        "settings": {k: _encode(v) for k, v in entry.settings.items()},
        "deferred": None if entry.deferred is None else sorted(entry.deferred),
    }


def decode(d: dict[str, Any]) -> tuple[str, registry.Entry, str]:
    """(kind, described entry, module): its factory and check import `module` when called."""
    kind, name, module = str(d["kind"]), str(d["name"]), str(d["module"])
    params_of = d["params_of"]
    entry = registry.Entry(
        name=name,
        factory=_StandIn(kind, name, "factory", module, d["factory"]),
        runtime=frozenset(d["runtime"]),
        inferred=frozenset(d["inferred"]),
        params_of=None
        if params_of is None
        else _StandIn(kind, name, "params_of", module, params_of),
        check=_check_of(kind, name, module, d["check"]),
        description=str(d["description"]),
        settings={str(k): _decode(v) for k, v in d["settings"].items()},
        deferred=None if d["deferred"] is None else frozenset(d["deferred"]),
    )
    return kind, entry, module


def _check_spec(check: Callable[..., None] | None) -> str | list[str] | bool:
    """A check marked `checks.light` by its `module:qualname` (called without its component's
    module), with the leading arguments it is bound to (``functools.partial(check, "cifar10")``:
    ``["module:qualname", "cifar10"]``); else whether there is one."""
    func, bound = check, []
    if isinstance(check, functools.partial) and not check.keywords:
        func, bound = check.func, list(check.args)
    if (
        func is not None
        and getattr(func, "light", False)
        and all(isinstance(a, str) for a in bound)
    ):
        spec = f"{func.__module__}:{func.__qualname__}"
        return [spec, *bound] if bound else spec
    return check is not None


def _check_of(kind: str, name: str, module: str, spec: str | list[str] | bool) -> Any:
    if isinstance(spec, str):
        return _Light(spec, [])
    if isinstance(spec, list):
        return _Light(spec[0], spec[1:])
    return _StandIn(kind, name, "check", module, []) if spec else None


class _Light:
    """A torch-free check of a described entry: its own module is imported when called."""

    def __init__(self, spec: str, bound: list[str]) -> None:
        self.spec, self.bound = spec, bound

    def __call__(self, **kwargs: Any) -> None:
        module, _, qualname = self.spec.partition(":")
        getattr(importlib.import_module(module), qualname)(*self.bound, **kwargs)


class _StandIn:
    """A described entry's factory, `params_of` or check: the signature its spec describes
    (built when first read: a command reads a few of them), the real one when called."""

    def __init__(self, kind: str, name: str, what: str, module: str, spec: Any) -> None:
        self.kind, self.name, self.what, self.spec = kind, name, what, spec
        self.__module__, self.__name__ = module, name
        self._signature: inspect.Signature | None = None

    @property
    def __signature__(self) -> inspect.Signature:  # what inspect.signature reads
        if self._signature is None:
            self._signature = _signature(self.spec)
        return self._signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(registry.real(self.kind, self.name), self.what)(*args, **kwargs)


def _spec(fn: Callable[..., Any]) -> list[list[Any]]:
    """[[name, kind, default, annotation], ...] of `fn`'s signature (empty when it has none)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    out = []
    for p in params:
        ann = p.annotation
        text = None if ann is p.empty else ann.__name__ if isinstance(ann, type) else str(ann)
        default = {"empty": True} if p.default is p.empty else _encode(p.default)
        out.append([p.name, p.kind.name, default, text])
    return out


def _signature(spec: list[list[Any]]) -> inspect.Signature:
    empty = inspect.Parameter.empty
    return inspect.Signature(
        [
            inspect.Parameter(
                name,
                getattr(inspect.Parameter, kind),
                default=empty if default == {"empty": True} else _decode(default),
                annotation=empty if ann is None else ann,
            )
            for name, kind, default, ann in spec
        ]
    )


def _encode(value: Any) -> Any:
    """A value as JSON that decodes to an equal value of the same type (tuples tagged); one
    JSON cannot hold (a class, a function: torchvision's norm_layer) as its repr and type name,
    which is what listing and composing read of it."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value  # JSON as Python writes it: Infinity and NaN too
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    return {"repr": repr(value), "type": type(value).__name__}


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode(v) for k, v in value["dict"].items()}
    return _opaque(str(value["repr"]), str(value["type"]))


class _Opaque:
    """A default no config value can be: its repr and its type's name, as the real one's."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _opaque(text: str, type_name: str) -> _Opaque:
    cls = type(type_name, (_Opaque,), {})
    return cls(text)
