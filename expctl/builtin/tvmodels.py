"""torchvision's classifiers by name, and the cache of their signatures.

Every classifier torchvision lists (`resnet18`, `vit_b_16`, ...) is a model name: built without
pretrained weights, with `num_classes` and `in_channels` adapted. Composing a config checks a
model's arguments against its class's signature; those signatures are cached as JSON
(``~/.cache/expctl/torchvision-KEY.json``), so a process that only composes (the one that
launches workers) never imports torchvision.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import math
import re
import sys
import typing
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from torch import nn

from expctl.cache import cache_dir, cache_key, cache_write
from expctl.registry import add_provider, register

_AUX_HEADS = {"googlenet", "inception_v3"}  # torchvision's default adds auxiliary outputs


def _torchvision_factory(name: str) -> Callable[..., nn.Module]:
    def factory(in_channels: int = 3, num_classes: int = 1000, **kwargs: object) -> nn.Module:
        # torchvision off composing and other models' runs:
        from torchvision import models as tvm  # noqa: PLC0415

        # a null argument is the builder's own default (wide_resnet50_2 sets width_per_group)
        given = {k: v for k, v in kwargs.items() if v is not None}
        if name in _AUX_HEADS:  # a plain logits tensor in training too, as every other model
            given.setdefault("aux_logits", False)
        model = tvm.get_model(name, weights=None, num_classes=num_classes, **given)
        if in_channels != 3:
            _adapt_stem(model, in_channels)
        return model

    factory.__name__ = name
    factory.__doc__ = (
        f"torchvision {name}, num_classes and in_channels adapted (no pretrained weights)."
    )
    return factory


def _adapt_stem(model: nn.Module, in_channels: int) -> None:
    """Replace the first Conv2d by one taking `in_channels` (as seed 001's 1-channel ResNet)."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                setattr(
                    parent,
                    child_name,
                    nn.Conv2d(
                        in_channels,
                        child.out_channels,
                        kernel_size=child.kernel_size,  # type: ignore[arg-type]
                        stride=child.stride,  # type: ignore[arg-type]
                        padding=child.padding,  # type: ignore[arg-type]
                        bias=child.bias is not None,
                    ),
                )
                return


def _builder_sets(builder: object, cls: type) -> list[str] | None:
    """The class arguments a torchvision builder sets itself, by keyword or through the helper it
    calls (wide_resnet50_2's width_per_group, densenet121's growth_rate): they stay null unless
    the user sets them, while the others show the class's defaults. None when the builder's
    source cannot be read (then all are null)."""
    try:
        source = inspect.getsource(builder)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    scope = getattr(inspect.unwrap(builder), "__globals__", {})  # type: ignore[arg-type]
    helped: set[str] = set()
    for callee in re.findall(r"\b(_\w+)\(", source):  # _densenet(32, (6, 12, 24, 16), ...)
        fn = scope.get(callee)
        if inspect.isfunction(fn):
            helped |= {
                p.name
                for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            }
    names = inspect.signature(cls).parameters
    said = [n for n in names if re.search(rf"[\"']{n}[\"']|\b{n}\s*=", source)]
    return sorted(set(said) | (helped & set(names)))


def _register_torchvision() -> None:
    """Register torchvision's classifiers from the signature cache when it is current: composing
    a config then checks a torchvision model's arguments without importing torchvision (and
    torch._dynamo with it: ~2 s in every process that launches workers). Models whose class
    has a default JSON cannot hold (a class, a partial: ViT, Swin, ShuffleNet, MaxViT) are
    registered by a second provider that imports torchvision, only if one of them is asked for."""
    path = _signature_cache()
    specs = _read_specs(path) if path is not None else None
    entries = _from_specs(specs) if specs is not None else None
    if specs is None or entries is None:  # no cache, or a damaged one: made again
        specs = _torchvision_specs()
        entries = _from_specs(specs) or []
        if path is not None:  # the newest 8 stay: one per environment sharing the folder
            others = list(path.parent.glob("torchvision-*.json")) if path.parent.is_dir() else []
            stale = sorted(others, key=_mtime, reverse=True)[7:]
            stored = {"specs": specs, "sha256": _digest(specs)}
            cache_write(path, [json.dumps(stored).encode()], stale)
    for name, params_of, deferred in entries:
        _register_tv(name, params_of, deferred)
    if specs["imported"]:
        add_provider("models", _register_imported)


def _from_specs(specs: dict[str, typing.Any]) -> list[tuple[str, typing.Any, object]] | None:
    """(name, params_of, deferred) of each cached model; None when a spec is malformed."""
    try:
        return [
            (str(name), _stub(name, spec["params"]), spec["deferred"])
            for name, spec in specs["models"].items()
        ]
    except (TypeError, ValueError, KeyError, AttributeError):
        return None


def _register_tv(name: str, params_of: Callable[..., object] | None, deferred: object) -> None:
    register(
        "models",
        name,
        inferred=("in_channels", "num_classes"),
        params_of=params_of,
        deferred=deferred if isinstance(deferred, list) else None,
    )(_torchvision_factory(name))


def _register_imported() -> None:
    """Every classifier from torchvision itself (the cached ones again, to the same entries)."""
    for name, cls, builder in _torchvision_classes():
        if isinstance(cls, type):
            _register_tv(name, cls, _builder_sets(builder, cls))
        else:
            _register_tv(name, None, None)


def _torchvision_classes() -> list[tuple[str, object, object]]:
    """(name, the class its builder returns or None, the builder) of every classifier."""
    # torchvision off composing and other models' runs:
    from torchvision import models as tvm  # noqa: PLC0415

    out = []
    for name in tvm.list_models(module=tvm):
        builder = tvm.get_model_builder(name)
        try:
            cls = typing.get_type_hints(builder).get("return")
        except Exception:  # an annotation torchvision cannot resolve: accept any argument
            cls = None
        out.append((name, cls, builder))
    return out


_UNCACHEABLE = object()


def _torchvision_specs() -> dict[str, typing.Any]:
    """What registering each classifier needs, as JSON: its class's parameters (name, kind,
    default, annotation) and the arguments its builder sets; `imported`: the names whose class
    defaults JSON cannot hold."""
    models: dict[str, typing.Any] = {}
    imported: list[str] = []
    for name, cls, builder in _torchvision_classes():
        params = _spec(cls)
        if params is _UNCACHEABLE:
            imported.append(name)
            continue
        deferred = _builder_sets(builder, cls) if isinstance(cls, type) else None
        models[name] = {"params": params, "deferred": deferred}  # deferred None: all of them
    return {"models": models, "imported": imported}


def _spec(cls: object) -> typing.Any:
    """[[name, kind, default, annotation], ...] of `cls`'s signature; None when `cls` is not a
    class (any argument is accepted); _UNCACHEABLE when a default is no JSON value."""
    if not isinstance(cls, type):
        return None
    out = []
    for p in inspect.signature(cls).parameters.values():
        default = _encode(p.default) if p.default is not p.empty else {"empty": True}
        if default is _UNCACHEABLE:
            return _UNCACHEABLE
        ann = p.annotation
        text = None if ann is p.empty else ann.__name__ if isinstance(ann, type) else str(ann)
        out.append([p.name, p.kind.name, default, text])
    return out


def _encode(value: object) -> object:
    """A default as JSON that decodes to an equal value of the same types (tuples tagged)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _UNCACHEABLE
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        if any(i is _UNCACHEABLE for i in items):
            return _UNCACHEABLE
        return {"tuple": items} if isinstance(value, tuple) else items
    return _UNCACHEABLE  # a class, a function, a partial, a dict (none is a classifier default)


def _decode(value: typing.Any) -> object:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        return tuple(_decode(v) for v in value["tuple"])
    return value


def _stub(name: str, params: typing.Any) -> Callable[..., object] | None:
    """A callable carrying the signature a spec describes (what `params_of` is read for)."""
    if params is None:
        return None

    def params_of(*args: object, **kwargs: object) -> typing.NoReturn:
        raise TypeError(f"{name}: a signature from expctl's cache, not torchvision's class")

    empty = inspect.Parameter.empty
    params_of.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                pname,
                getattr(inspect.Parameter, kind),
                default=empty if default == {"empty": True} else _decode(default),
                annotation=empty if ann is None else ann,
            )
            for pname, kind, default, ann in params
        ]
    )
    return params_of


def _signature_cache() -> Path | None:
    """The cache file for this Python, torch, torchvision and this file; None without
    torchvision (its import then fails as before)."""
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        versions = [sys.version, version("torch"), version("torchvision")]
    except PackageNotFoundError:
        return None
    folders = [Path(loc) / "models" for loc in spec.submodule_search_locations]
    files = [Path(__file__), *(f for d in folders for f in sorted(d.glob("*.py")))]
    return cache_dir() / f"torchvision-{cache_key(versions, files)}.json"


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another process
        return 0.0


def _read_specs(path: Path) -> dict[str, typing.Any] | None:
    """The cached specs, or None when absent, unreadable or not as written (a checksum of the
    content guards against a truncated or edited file: then they are made again)."""
    try:
        stored = json.loads(path.read_text())
        specs, digest = stored["specs"], stored["sha256"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if digest != _digest(specs):
        return None
    ok = isinstance(specs, dict) and isinstance(specs.get("models"), dict)
    return specs if ok and isinstance(specs.get("imported"), list) else None


def _digest(specs: object) -> str:
    return hashlib.sha256(json.dumps(specs, sort_keys=True).encode()).hexdigest()


add_provider("models", _register_torchvision)
