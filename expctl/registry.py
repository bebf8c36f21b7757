"""Flat name -> factory registries for models, datasets, optimizers, schedulers, losses, steps
and loggers.

Built-in components register themselves when their module is imported; `load_builtins()` imports
them (and installed plugins' ``expctl.plugins`` entry points) the first time a registry is read.
User components live in the user's own module, listed under ``imports:`` in the config:

    from expctl import register

    @register("models", "my_net")
    def my_net(width: int = 64, num_classes: int = 10) -> nn.Module: ...

A config's arguments are checked against a factory's signature in `signatures.py`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from expctl import importpath
from expctl.errors import UserError, unknown_name

KINDS = ("models", "datasets", "optimizers", "schedulers", "losses", "steps", "loggers")
_ALIASES = {k[:-1]: k for k in KINDS} | {"optim": "optimizers", "sched": "schedulers"}
_SECTIONS = {
    "models": "model",
    "datasets": "data",
    "optimizers": "optim",
    "schedulers": "sched",
    "losses": "loss",
    "steps": "train.step",
    "loggers": "logger",
}
LOGGER_RUNTIME = ("run_dir", "start_step")  # what expctl passes a logger that asks for it
BUILTIN_MODULES = (
    "expctl.builtin.models",
    "expctl.builtin.tvmodels",
    "expctl.builtin.gpt",
    *(
        f"expctl.builtin.datasets.{m}"
        for m in ("idx", "vision", "images", "arrays", "synthetic", "tokens")
    ),
    "expctl.builtin.optim",
    "expctl.builtin.steps",
    "expctl.builtin.loggers",
)


@dataclass(frozen=True)
class Entry:
    """One registered component.

    Args:
        name: the name configs use.
        factory: the callable that builds it.
        runtime: parameters the framework passes itself (e.g. ``params`` of an optimizer).
        inferred: parameters filled from the data when the config leaves them out.
        params_of: for factories taking ``**kwargs``, the callable whose signature they accept.
        check: a cheap pre-flight check run with the config's arguments before any worker starts
            (e.g. that data files exist); raises UserError.
        settings: defaults of the config section's own keys for this component (a scheduler
            stepped every optimizer step: ``{"interval": "step"}``).
        deferred: arguments of `params_of` that the factory's builder sets itself (null in the
            config unless the user sets them); None: all of them.
    """

    name: str
    factory: Callable[..., Any]
    runtime: frozenset[str] = frozenset()
    inferred: frozenset[str] = frozenset()
    params_of: Callable[..., Any] | None = None
    check: Callable[..., None] | None = None
    description: str = ""
    settings: Mapping[str, Any] = field(default_factory=dict)
    deferred: frozenset[str] | None = None  # params_of arguments the builder sets itself

    def parameters(self) -> dict[str, inspect.Parameter]:
        """User-settable parameters: the factory's (and `params_of`'s) minus runtime ones."""
        out: dict[str, inspect.Parameter] = {}
        for fn in (self.params_of, self.factory):
            if fn is None:
                continue
            for p in _signature(fn).parameters.values():
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in self.runtime:
                    continue
                if fn is self.params_of and p.default is p.empty:
                    continue  # supplied by the factory itself (e.g. ResNet's block, layers)
                if p.name != "self":
                    out[p.name] = p
        return out

    def defers(self, key: str) -> bool:
        """Whether a null `key` means "not set here": inferred from the data, or left to the
        builder behind `params_of` (torchvision's builders set some class arguments)."""
        if key in self.inferred:
            return True
        if self.deferred is not None:
            return key in self.deferred
        own = _signature(self.factory).parameters
        return self.params_of is not None and key not in own

    def accepts_any(self) -> bool:
        """True when extra keyword arguments cannot be checked (a bare ``**kwargs``)."""
        if self.params_of is not None:
            return _has_var_kw(self.params_of)
        return _has_var_kw(self.factory)


@dataclass
class Registry:
    """Names of one kind of component, mapped to their entries."""

    kind: str
    entries: dict[str, Entry] = field(default_factory=dict)

    def add(self, entry: Entry) -> None:
        """Register `entry`; a second registration of a name replaces the first (reloads)."""
        self.entries[entry.name] = entry


_REGISTRIES: dict[str, Registry] = {k: Registry(k) for k in KINDS}
_PROVIDERS: dict[str, list[Callable[[], None]]] = {k: [] for k in KINDS}
_loaded = False
_ORIGINS: dict[tuple[str, str], str] = {}  # (kind, name) -> the module that registered it
# (kind, name) -> a described entry (`describe_builtins`) and the module that registers it
_DESCRIBED: dict[tuple[str, str], tuple[Entry, str]] = {}


def add_provider(kind: str, provider: Callable[[], None]) -> None:
    """Register names lazily: `provider()` runs (once) the first time a name of `kind` is not
    found or all names are listed (torchvision's models load only when asked for)."""
    _PROVIDERS[canonical_kind(kind)].append(provider)


def _provide(kind: str, until: str | None = None) -> None:
    """Run `kind`'s pending providers in order (those a provider adds too), all of them or
    until `until` is registered."""
    while _PROVIDERS[kind] and (until is None or until not in _REGISTRIES[kind].entries):
        _PROVIDERS[kind].pop(0)()


def canonical_kind(kind: str) -> str:
    """The registry kind for `kind` (accepts singular forms and section names)."""
    k = _ALIASES.get(kind, kind)
    if k not in _REGISTRIES:
        raise unknown_name("registry", kind, KINDS, "use one of the kinds above")
    return k


def register(
    kind: str,
    name: str | None = None,
    *,
    runtime: Iterable[str] = (),
    inferred: Iterable[str] = (),
    params_of: Callable[..., Any] | None = None,
    check: Callable[..., None] | None = None,
    description: str | None = None,
    settings: Mapping[str, Any] | None = None,
    deferred: Iterable[str] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a factory under `name` (default: the function's name)."""

    origin = str(sys._getframe(1).f_globals.get("__name__", ""))  # what imports it again

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        doc = description if description is not None else (inspect.getdoc(fn) or "")
        implied, passed, own = inferred, runtime, _signature(fn).parameters
        if not inferred and canonical_kind(kind) == "models":  # filled from the data by name
            implied = [n for n in ("in_channels", "num_classes", "input_shape") if n in own]
        if not runtime and canonical_kind(kind) == "loggers":  # passed by expctl, by name
            passed = [n for n in LOGGER_RUNTIME if n in own]
        _REGISTRIES[canonical_kind(kind)].add(
            Entry(
                name=name or fn.__name__,
                factory=fn,
                runtime=frozenset(passed),
                inferred=frozenset(implied),
                params_of=params_of,
                check=check,
                description=doc.strip().splitlines()[0] if doc.strip() else "",
                settings=dict(settings or {}),
                deferred=None if deferred is None else frozenset(deferred),
            )
        )
        _ORIGINS[(canonical_kind(kind), name or fn.__name__)] = origin
        return fn

    return deco


def load_builtins() -> None:
    """Import the built-in component modules and installed plugins (once)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in () if _DESCRIBED else BUILTIN_MODULES:  # described: imported when called
        importlib.import_module(mod)
    # importlib.metadata (0.06 s) off `import expctl` and every command that loads no component
    from importlib.metadata import entry_points  # noqa: PLC0415

    for ep in entry_points(group="expctl.plugins"):
        ep.load()


def builtins_known() -> bool:
    """Whether the built-in components are registered in this process: their modules imported
    (`load_builtins`) or described (`describe_builtins`)."""
    return _loaded or bool(_DESCRIBED)


def describe_builtins(described: Iterable[tuple[str, Entry, str]]) -> None:
    """Serve the built-in names from descriptions instead of their modules: (kind, entry,
    module) where the entry's signatures are stand-ins (catalogue.py's snapshot) and `module`
    registers the real one. Listing, composing and checking arguments then import no torch; a
    described entry's factory or check imports `module` when called (`real`). Nothing happens
    once the built-in modules are imported: their entries are here already."""
    if _loaded:
        return
    for kind, entry, module in described:
        reg = _REGISTRIES[canonical_kind(kind)]
        if entry.name not in reg.entries:  # registered for real meanwhile (expctl.builtin.loggers)
            reg.add(entry)
            _DESCRIBED[(reg.kind, entry.name)] = (entry, module)


def builtin_entries() -> list[tuple[str, Entry, str]]:
    """Every entry expctl's own modules register (kind, entry, module), those their providers
    add included: what `describe_builtins` takes (plugins are not loaded)."""
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)
    out = []
    for kind, reg in _REGISTRIES.items():
        _provide(kind)
        for name, entry in sorted(reg.entries.items()):
            origin = _ORIGINS.get((kind, name), "")
            if origin in BUILTIN_MODULES:
                out.append((kind, entry, origin))
    return out


def real(kind: str, name: str) -> Entry:
    """The entry of `name` as its module registers it: a described one's module is imported
    (and the providers it adds run) first."""
    reg = _REGISTRIES[canonical_kind(kind)]
    described, module = _DESCRIBED.get((reg.kind, name), (None, ""))
    if described is not None and reg.entries.get(name) is described:
        importlib.import_module(module)
        while reg.entries.get(name) is described and _PROVIDERS[reg.kind]:
            _PROVIDERS[reg.kind].pop(0)()  # torchvision's models come from a provider
        if reg.entries.get(name) is described:  # a snapshot of other sources: its key is wrong
            raise RuntimeError(f"{module} did not register {reg.kind} '{name}'")
    return get(reg.kind, name)


def check_module_name(module: str) -> None:
    """Raise a UserError unless `module` is a dotted module name (``my_pkg.components``)."""
    if not isinstance(module, str) or not all(p.isidentifier() for p in module.split(".")):
        raise UserError(
            f"imports: cannot import module {module!r}: not a dotted module name",
            "list module names, not paths or files (e.g. imports=[my_pkg.components]): they are "
            "found in the current directory, next to the -C file, and on PYTHONPATH",
        )


def import_user_modules(
    modules: Iterable[str], found: Mapping[str, Mapping[str, str]] | None = None
) -> None:
    """Import the modules a config lists under ``imports:`` (their decorators register names),
    where `importpath.searching` looks: first from the folders a run recorded for them (`found`,
    from its imports.json: see `importpath.origins`) while the recorded file is still there,
    then from the current directory and the -C file's folder. Without modules the module search
    path is left as it is: a colorama.py or dill.py there would stand in for an optional package
    that is not installed."""
    modules, found = list(modules), found or {}
    if not modules:
        return
    for mod in modules:
        check_module_name(mod)
    with importpath.searching(found[m] for m in modules if m in found):
        for mod in modules:
            _import(mod, found.get(mod))


def _import(mod: str, was: Mapping[str, str] | None) -> None:
    try:
        importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            raise _not_found(mod, e.name, was) from None
        raise _import_failed(mod, e) from None
    except UserError:
        raise
    except (Exception, SystemExit) as e:  # the user's module is broken: where, in one line
        raise _import_failed(mod, e) from None


def _not_found(mod: str, name: str, was: Mapping[str, str] | None) -> UserError:
    if was is not None:
        return UserError(
            f"imports: cannot import module '{mod}': the run imported it from "
            f"{was.get('file') or was['path']}, which is gone",
            f"put it back there, or make '{mod}' importable (PYTHONPATH, the current directory)",
        )
    return UserError(
        f"imports: cannot import module '{mod}' (no module named '{name}')",
        "list importable module names (e.g. 'my_pkg.components'): they are found in "
        "the current directory, next to the -C file, and on PYTHONPATH",
    )


def _import_failed(mod: str, e: BaseException) -> UserError:

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(e, SyntaxError) and e.filename:
        where = f" at {e.filename}:{e.lineno}"
    text = " ".join(str(e).split())[:200]
    return UserError(
        f"imports: module '{mod}' failed to import{where}: {type(e).__name__}: {text}",
        f"fix the module (python -c 'import {mod}' shows the whole traceback)",
    )


def names(kind: str) -> list[str]:
    """Sorted registered names of `kind`."""
    load_builtins()
    _provide(canonical_kind(kind))
    return sorted(_REGISTRIES[canonical_kind(kind)].entries)


def get(kind: str, name: str) -> Entry:
    """The entry for `name`, or a UserError listing valid names with a did-you-mean."""
    load_builtins()
    reg = _REGISTRIES[canonical_kind(kind)]
    if name not in reg.entries:
        _provide(reg.kind, until=name)
    if name not in reg.entries:
        raise unknown_name(
            f"{_SECTIONS[reg.kind]} name",
            name,
            reg.entries,
            f"see `expctl list {reg.kind}`; register your own with @expctl.register("
            f"'{reg.kind}', '{name}') in a module listed under `imports:`",
        )
    return reg.entries[name]


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return inspect.Signature()


def _has_var_kw(fn: Callable[..., Any]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in _signature(fn).parameters.values())
