"""Validation: a composed (or loaded) config dict checked and built into the frozen `Config`.

On top of OmegaConf's types: ranges, choices with did-you-mean, finite floats, and cross-section
checks (`crosschecks.py`), all raised as UserError; `check_registered` checks every component
against the registries. Values bound for a file name or an sbatch script are checked by
`values.py`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import field
from typing import Any

from expctl import registry
from expctl.config.components import check_registered
from expctl.config.crosschecks import cross_checks
from expctl.config.schema import (
    DEFAULT_EPOCHS,
    FIXED,
    LAUNCHERS,
    SECTIONS,
    Config,
    LauncherConfig,
    TrainConfig,
    framework_keys,
)
from expctl.errors import UserError, choices_text, did_you_mean


def validate(
    raw: dict[str, Any],
    check_components: bool = True,
    interpolations: dict[str, str] | None = None,
) -> Config:
    """Check a composed, resolved dict and build the frozen Config.

    Args:
        raw: the output of composition (or a loaded config.yaml), interpolations resolved.
        check_components: also check names and arguments against the registries (imports
            `imports:` modules and the built-ins, which imports torch).
        interpolations: dotted key -> `${oc.env:...}` text, kept unresolved when written.

    Raises:
        UserError: unknown keys (with did-you-mean), wrong types, out-of-range values.
    """
    if not isinstance(raw, dict):
        raise UserError("the config must be a mapping of sections")
    known = {f.name for f in dataclasses.fields(Config)} - {"interpolations"}
    for key in raw:
        if key not in known:
            owner = next(
                (s for s, c in FIXED.items() if key in {f.name for f in dataclasses.fields(c)}),
                None,
            )
            guess = f" Did you mean '{owner}.{key}'?" if owner else did_you_mean(key, known)
            raise UserError(
                f"unknown config section '{key}'.{guess} Valid: {choices_text(known)}",
                f"put it under its section: {owner}: {{{key}: ...}}"
                if owner
                else "remove it, or fix its spelling",
            )
    for name in ("model", "data", "optim", "loss"):
        if raw.get(name) is None:
            raise UserError(f"the config has no '{name}' section", f"add {name}=NAME")
    values: dict[str, Any] = {"interpolations": dict(interpolations or {})}
    for name, value in raw.items():
        if name in SECTIONS:
            values[name] = _component(name, value)
        elif name in FIXED:
            values[name] = _typed(name, FIXED[name], value)
        elif name == "launcher":
            values[name] = _launcher(value)
        else:
            values[name] = _plain(name, value)
    _check_finite("", raw)
    train = values.get("train")
    if isinstance(train, TrainConfig) and train.max_epochs is None and train.max_steps is None:
        values["train"] = dataclasses.replace(train, max_epochs=DEFAULT_EPOCHS)
    cfg = Config(**values)
    cross_checks(cfg)
    if check_components:
        check_registered(cfg)
    return cfg


def recheck(cfg: Config) -> None:
    """The checks of `validate` whose outcome may change while the config does not: the files
    a key names (cross-section checks) and each component's pre-flight check. For a Config
    validated earlier (`config/kept.py`)."""
    cross_checks(cfg)
    check_registered(cfg)


def _typed(where: str, cls: type, value: Any) -> Any:
    """`value` checked against the dataclass `cls` by OmegaConf (types, unknown keys), then
    against the fields' choices and minimums; returns an instance of `cls`."""
    # OmegaConf off `status` and `run --help`:
    from omegaconf import OmegaConf  # noqa: PLC0415
    from omegaconf.errors import (  # noqa: PLC0415
        ConfigKeyError,
        OmegaConfBaseException,
        ValidationError,
    )

    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: expected a mapping, got {value!r}", f"e.g. {where}.KEY=VALUE")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            raise unknown_key(where, str(key), list(fields))
    free = {k: v for k, v in value.items() if fields[k].type == "Any"}
    for key, v in value.items():  # a section inside the section (train.early_stop)
        inner = fields[key].default
        if dataclasses.is_dataclass(inner) and not isinstance(v, type(inner)):
            free[key] = _typed(f"{where}.{key}", type(inner), v)
    typed = {k: v for k, v in value.items() if k not in free}
    try:
        node = OmegaConf.merge(_structured(cls), typed)  # merge copies it
        obj = OmegaConf.to_object(node)
    except ValidationError as e:
        key = str(getattr(e, "full_key", "") or "")
        bad = typed.get(key.split(".")[0]) if key else None
        expected = _type_name(fields[key.split(".")[0]].type) if key in fields else "another type"
        raise UserError(
            f"{where}.{key}: expected {expected}, got {bad!r}",
            f"set {where}.{key} to a value of type {expected}",
        ) from None
    except (ConfigKeyError, OmegaConfBaseException) as e:
        raise UserError(f"{where}: {' '.join(str(e).split())[:200]}") from None
    obj = dataclasses.replace(obj, **free)  # type: ignore[type-var]
    checked = {
        key: _check_field(f"{where}.{key}", getattr(obj, key), f) for key, f in fields.items()
    }
    return dataclasses.replace(obj, **checked)  # type: ignore[type-var]


_STRUCTURED: dict[type, Any] = {}


def _structured(cls: type) -> Any:
    """OmegaConf's node of the dataclass `cls`, made once (a sweep validates every point)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `status` and `run --help`

    if cls not in _STRUCTURED:
        _STRUCTURED[cls] = OmegaConf.structured(cls)
    return _STRUCTURED[cls]


def _type_name(annotation: Any) -> str:
    text = str(annotation).replace(" | None", " or null")
    return {"int": "int", "float": "float", "str": "str", "bool": "bool"}.get(text, text)


def _component(section: str, value: Any) -> Any:
    cls = SECTIONS[section]
    if isinstance(value, str) or (value is None and section == "sched"):
        value = {"name": value}  # `model: resnet18` is short for `model: {name: resnet18}`
    if not isinstance(value, dict):
        raise UserError(f"{section}: expected a mapping, got {value!r}", f"e.g. {section}.name=...")
    own = framework_keys(section)
    if "name" not in value and section != "sched":
        raise UserError(f"{section}.name is required", f"set {section}=NAME")
    frame = _typed(section, _without_args(cls), {k: v for k, v in value.items() if k in own})
    args = {str(k): v for k, v in value.items() if k not in own}
    return cls(**{k: getattr(frame, k) for k in own}, args=args)


_NO_ARGS: dict[type, type] = {}


def _without_args(cls: type) -> type:
    """`cls` without its ``args`` field: the framework keys OmegaConf checks."""
    if cls not in _NO_ARGS:
        fields = [
            (f.name, f.type, field(default=f.default, metadata=f.metadata))
            if f.default is not dataclasses.MISSING
            else (f.name, f.type)
            for f in dataclasses.fields(cls)
            if f.name != "args"
        ]
        made = dataclasses.make_dataclass(cls.__name__, fields, frozen=True)
        made.__module__ = __name__  # its annotations are evaluated here
        _NO_ARGS[cls] = made
    return _NO_ARGS[cls]


def _launcher(value: Any) -> LauncherConfig:
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, dict):
        raise UserError(f"launcher: expected a mapping, got {value!r}", "e.g. launcher=local")
    name = value.get("name", "inline")
    if name not in LAUNCHERS:
        raise UserError(
            f"launcher: no '{name}' launcher.{did_you_mean(str(name), LAUNCHERS)} "
            f"Valid: {choices_text(LAUNCHERS)}",
            "launcher=inline (this process), local (N workers here) or slurm (submitit)",
        )
    cls = LAUNCHERS[name]
    for key in value:
        if key not in {f.name for f in dataclasses.fields(cls)}:
            owners = [
                n for n, c in LAUNCHERS.items() if key in {f.name for f in dataclasses.fields(c)}
            ]
            if owners:
                raise UserError(
                    f"'launcher.{key}' is not a key of launcher={name}.",
                    f"launcher={owners[0]} has it: pick that launcher first",
                )
    chosen = _typed("launcher", cls, value)
    return LauncherConfig(**dataclasses.asdict(chosen))


def _loggers(value: Any) -> dict[str, dict[str, Any]]:
    """`logger`: a list of logger names, or a mapping of names to their arguments."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {v: {} for v in value}
    if isinstance(value, dict) and all(isinstance(v, dict) or v is None for v in value.values()):
        return {str(k): dict(v or {}) for k, v in value.items()}
    raise UserError(
        f"logger: expected a list of logger names or a mapping of them, got {value!r}",
        "e.g. logger=[tensorboard,csv]; `expctl list loggers` names them",
    )


def _plain(name: str, value: Any) -> Any:
    if name == "logger":
        return _loggers(value)
    if name == "imports":
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UserError(
                f"imports: expected a list of module names, got {value!r}",
                "e.g. imports=[my_components]",
            )
        for module in value:
            registry.check_module_name(module)
        return list(value)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"env: expected a mapping, got {value!r}", "e.g. env.NCCL_DEBUG=INFO")
    out = {}
    for key, v in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key)):
            raise UserError(
                f"env.{str(key)!r}: not an environment variable name", "use letters, digits and _"
            )
        if v is None or isinstance(v, (dict, list)):
            raise UserError(f"env.{key}: expected a string value", f"e.g. env.{key}=VALUE")
        out[str(key)] = str(v).lower() if isinstance(v, bool) else str(v)
        if "\0" in out[str(key)]:  # the one character an environment variable cannot hold
            raise UserError(
                f"env.{key}={out[str(key)]!r}: a NUL byte cannot go into an environment variable",
                f"remove it from env.{key}",
            )
    return out


def _check_finite(prefix: str, value: Any) -> None:
    """Every float of the config is finite: NaN and infinity are never a setting."""
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(
            f"{prefix}={value}: not a finite number",
            f"set {prefix} to a finite value (NaN and infinity are refused everywhere)",
        )
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(f"{prefix}.{k}" if prefix else str(k), v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(f"{prefix}[{i}]", v)


def unknown_key(where: str, key: str, valid: list[str]) -> UserError:
    """The error for a key `where.key` that the section lacks."""
    return UserError(
        f"unknown key '{where}.{key}'.{did_you_mean(key, valid)} Valid: {choices_text(valid)}",
        f"remove {where}.{key} or fix its spelling (`expctl show` prints every key)",
    )


# what users of other tools write, and the value meant here (suggested, never silently accepted)
_ALIASES = {
    "gpu": "cuda",
    "fp16": "16",
    "float16": "16",
    "half": "16",
    "16-mixed": "16",
    "bfloat16": "bf16",
    "bf16-mixed": "bf16",
    "fp32": "32",
    "float32": "32",
    "32-true": "32",
}


def _check_field(where: str, value: Any, f: dataclasses.Field[Any]) -> Any:
    choices = f.metadata.get("choices")
    if choices and True in choices and isinstance(value, str):
        value = {"true": True, "false": False}.get(value.lower(), value)  # "true" from a file
    if choices and not any(value == c and type(value) is type(c) for c in choices):
        shown = ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in choices)
        alias = _ALIASES.get(str(value).lower())
        suggest = (
            f" Did you mean '{alias}'?"
            if alias in choices
            else did_you_mean(str(value), [str(c) for c in choices])
        )
        # true/false for a choice of names: OmegaConf made the YAML bool a str ('True')
        switch = isinstance(value, bool) or value in ("True", "False")
        said = str(value).lower() if switch else value  # as YAML writes it
        if switch and not suggest:
            suggest = " It takes one of these names, not true/false."
        raise UserError(
            f"{where}: '{said}' is not one of: {shown}.{suggest}",
            f"set {where} to one of: {shown}",
        )
    low, high = f.metadata.get("min"), f.metadata.get("max")
    if low is not None and value is not None and value < low:
        raise UserError(f"{where}: {value} is below the minimum {low:g}", f"set {where} >= {low:g}")
    if high is not None and value is not None and high < value < math.inf:  # inf: not finite
        raise UserError(
            f"{where}: {value} is above the maximum {high}", f"set {where} to at most {high}"
        )
    return value
