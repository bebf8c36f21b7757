"""Hydra's ConfigStore: the schema's sections, and one node per registered component.

A component's node holds ``name``, the section's framework keys (``data.batch_size``) with the
entry's own defaults, and every argument of the factory a YAML value can set, with its signature
default; ``null`` means "inferred from the data" or "the model builder's own default", ``???``
"required". OmegaConf checks the types it can express (int, float, bool, str); the signature
check (`signatures.check_args`) runs on top.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from expctl import registry, signatures
from expctl.config import schema
from expctl.errors import UserError

REGISTRY_GROUP = "expctl_registry"
SCHEMA = "expctl_schema"
_STORED: set[tuple[str, str]] = set()


def store_schema(groups: tuple[str, ...]) -> None:
    """Store the schema root (fixed sections typed, `groups` left to their options), the
    launchers and ``sched=none`` (once per process)."""
    # Hydra and OmegaConf off `run --help` and completion:
    from hydra.core.config_store import ConfigStore  # noqa: PLC0415
    from omegaconf import MISSING, OmegaConf  # noqa: PLC0415

    if ("", SCHEMA) in _STORED:
        return
    root = OmegaConf.create({})
    for name, cls in schema.FIXED.items():
        root[name] = _open_maps(_unfrozen(OmegaConf.structured(cls)))
    for name in groups:
        root[name] = MISSING
    root["imports"] = []
    root["env"] = {}
    OmegaConf.set_struct(root["env"], False)
    root["logger"] = {}  # the picked loggers, with their arguments (layers.Stack.chosen_loggers)
    OmegaConf.set_struct(root["logger"], False)
    cs = ConfigStore.instance()
    cs.store(name=SCHEMA, node=root)
    for name, cls in schema.LAUNCHERS.items():
        node = _open_maps(_unfrozen(OmegaConf.structured(cls)))
        cs.store(group=f"{REGISTRY_GROUP}/launcher", name=name, node=node)
    none = {"name": None, "interval": schema.SchedConfig.interval}  # the schema's default
    cs.store(group=f"{REGISTRY_GROUP}/sched", name="none", node=none)
    _STORED.add(("", SCHEMA))


def store_components(choices: Mapping[str, str]) -> None:
    """Store the nodes of the chosen registered components (each once per process)."""
    # Hydra off `run --help`, completion:
    from hydra.core.config_store import ConfigStore  # noqa: PLC0415

    cs = ConfigStore.instance()
    for section, kind in schema.COMPONENT_KINDS.items():
        name = choices[section]
        if (section, name) in _STORED or (section, name) == ("sched", "none"):
            continue
        node = component_node(section, registry.get(kind, name))
        cs.store(group=f"{REGISTRY_GROUP}/{section}", name=name, node=node)
        _STORED.add((section, name))


def _child(node: Any, key: Any) -> Any:
    """The node under `key` when it is a config (a DictConfig is returned as itself)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `run --help`, completion

    return OmegaConf.select(
        node, str(key), throw_on_missing=False, throw_on_resolution_failure=False
    )


def _unfrozen(node: Any) -> Any:
    """A structured node of a frozen dataclass, made writable (Hydra merges into it)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `run --help`, completion

    OmegaConf.set_readonly(node, None)
    for key in node:
        child = _child(node, key)
        if OmegaConf.is_config(child):
            _unfrozen(child)
    return node


def _open_maps(node: Any) -> Any:
    """Dict-typed keys (sbatch, params) accept new keys."""
    # OmegaConf off `run --help`, completion:
    from omegaconf import DictConfig, OmegaConf  # noqa: PLC0415

    for key in node:
        child = _child(node, key)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) is dict:
            OmegaConf.set_struct(child, False)
    return node


def component_node(section: str, entry: Any) -> type:
    """The dataclass of one registered component's node (see the module docstring)."""
    from omegaconf import MISSING  # noqa: PLC0415 - OmegaConf off `run --help`, completion

    fields: list[tuple[str, Any, Any]] = []
    for key, f in schema.framework_keys(section).items():
        default = entry.name if key == "name" else entry.settings.get(key, f.default)
        fields.append((key, _annotation(f.type), dataclasses.field(default=default)))
    for p in entry.parameters().values():
        if p.name in schema.framework_keys(section) or not settable(p):
            continue
        if entry.defers(p.name):
            fields.append((p.name, Any, dataclasses.field(default=None)))
        elif p.default is p.empty:
            fields.append((p.name, Any, dataclasses.field(default=MISSING)))
        elif isinstance(p.default, (list, tuple, dict)):
            value = list(p.default) if isinstance(p.default, tuple) else p.default
            fields.append((p.name, Any, dataclasses.field(default_factory=_const(value))))
        else:
            fields.append((p.name, _param_type(p), dataclasses.field(default=p.default)))
    cls = dataclasses.make_dataclass(_ident(entry.name), fields)
    cls.__module__ = __name__
    return cls


def node_defaults(section: str, entry: Any) -> dict[str, Any]:
    """The values of a component's node as a plain dict (``???`` for required arguments)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `run --help`, completion

    made = _DEFAULTS.get((section, id(entry)))
    if made is None or made[0] is not entry:  # made once per registered entry
        out = OmegaConf.to_container(OmegaConf.structured(component_node(section, entry)))
        assert isinstance(out, dict)
        made = _DEFAULTS[section, id(entry)] = (entry, {str(k): v for k, v in out.items()})
    return copy.deepcopy(made[1])


_DEFAULTS: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}


def complete(raw: dict[str, Any]) -> None:
    """Fill every chosen component's missing arguments with its signature defaults (a section
    that reached the config without its node, e.g. from a frozen config of an older version)."""
    from omegaconf import MISSING  # noqa: PLC0415 - OmegaConf off `run --help`, completion

    for section, kind in schema.COMPONENT_KINDS.items():
        value = raw.get(section)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            continue
        try:
            entry = registry.get(kind, value["name"])
        except UserError:
            continue  # validation names it
        for key, default in node_defaults(section, entry).items():
            if key not in value and default != MISSING:
                value[key] = default


def _const(value: Any) -> Any:
    return lambda: copy.deepcopy(value)


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out[:1].isalpha() else f"c_{out}"


def _annotation(text: Any) -> Any:
    return {"str": str, "str | None": str | None, "int": int, "int | None": int | None}.get(
        str(text), Any
    )


def settable(p: inspect.Parameter) -> bool:
    """Whether YAML can set the parameter: its annotation allows a plain value (not only a
    class, function, module or tensor) and its default is one."""
    return signatures.settable(p) and (p.default is p.empty or _yaml_value(p.default))


def _yaml_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_yaml_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _yaml_value(v) for k, v in value.items())
    return False


_SIMPLE = {"int": int, "float": float, "bool": bool, "str": str}


def _param_type(p: inspect.Parameter) -> Any:
    """int, float, bool or str (optional where None is allowed) when the annotation says one
    of them and the default fits it, else Any."""
    opts = [o for o in signatures.annotation_options(p) if o not in signatures.NEVER_FROM_YAML]
    simple = [o for o in opts if o != "None"]
    if len(simple) != 1 or simple[0] not in _SIMPLE:
        return Any
    t = _SIMPLE[simple[0]]
    fits = (int, float) if t is float else (t,)
    if (isinstance(p.default, bool) and t is not bool) or (
        p.default is not None and not isinstance(p.default, fits)
    ):
        return Any
    return t | None if "None" in opts or p.default is None else t
