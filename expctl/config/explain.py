"""Words for the config: one override parsed by Hydra's grammar, composition errors made
one-or-two-line UserErrors with a did-you-mean, and the keys each section and component takes."""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from expctl import registry, signatures
from expctl.config import schema
from expctl.errors import UserError, choices_text, did_you_mean


def explain(e: Exception, choices: Mapping[str, str], keys: Sequence[str]) -> UserError:
    """A Hydra / OmegaConf composition error as a UserError naming the key at fault."""
    # OmegaConf off `run --help`, completion:
    from omegaconf.errors import ConfigKeyError, ValidationError  # noqa: PLC0415

    cause: Any = e
    while not isinstance(cause, (ConfigKeyError, ValidationError)):
        nxt = cause.__cause__ or cause.__context__
        if nxt is None:
            break
        cause = nxt
    text = " ".join(str(e).split())
    full_key = str(getattr(cause, "full_key", "") or "")
    override = next(
        (k for k in keys if f"'{_key_of(k)}'" in text or f"override {k}" in text), None
    ) or next((k for k in keys if full_key and _key_of(k) == full_key), None)
    where = f"override {override.lstrip('+')!r}" if override else "the config"
    key = _key_of(override) if override else full_key
    if isinstance(cause, ValidationError):
        return UserError(
            f"{key}: {_type_text(str(cause).splitlines()[0])} ({where})",
            f"set {key} to a value of that type (`expctl show` prints every key and value)",
        )
    if (
        isinstance(cause, ConfigKeyError)
        or "Could not override" in text
        or "Could not append" in text
    ):
        return unknown_key(key, choices)
    swept = re.match(r"(?:Ambiguous value for argument|Sweep parameters) '([^']*)'", text)
    if swept:  # Hydra's own words are cut off, or send the user to its --multirun
        kv = swept.group(1)
        return UserError(
            f"{kv}: a sweep's values, which only `expctl run -m` runs",
            f"sweep it: expctl run -m '{kv}'; or write a list, {_key_of(kv)}=[...], "
            f"or quote a string, {_key_of(kv)}='...'",
        )
    return UserError(
        f"{where}: {text[:200]}",
        "overrides are key=value in Hydra syntax, e.g. optim.lr=0.05 or model=resnet18",
    )


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _type_text(msg: str) -> str:
    """OmegaConf's "Value 'x' of type 'str' could not be converted to Integer" -> expected int."""
    m = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if not m:
        return msg
    want = {"Integer": "int", "Float": "float", "Boolean": "bool", "String": "str"}.get(
        m.group(3), m.group(3)
    )
    return f"expected {want}, got {m.group(1)!r}"


def unknown_key(key: str, choices: Mapping[str, str]) -> UserError:
    """A key the config lacks: did-you-mean across sections, and the component that has it."""
    parts = key.split(".")
    section, leaf = parts[0], parts[-1]
    everything = all_keys(choices)
    sections = [k for k in everything if "." not in k]
    if len(parts) == 1 or section not in everything:
        same_leaf = [k for k in everything if k.rsplit(".", 1)[-1] == leaf and k != key]
        close = same_leaf[0] if same_leaf else None
        if close is None:
            fixed = _closest(section, sections)
            close = f"{fixed}.{'.'.join(parts[1:])}" if fixed and len(parts) > 1 else fixed
        return UserError(
            f"unknown config key '{key}'."
            + (f" Did you mean '{close}'?" if close else "")
            + f" Sections: {choices_text(sections)}",
            f"keys are SECTION.KEY, e.g. {close or 'train.max_epochs'}=VALUE "
            "(`expctl show` prints them all)",
        )
    valid = [k.split(".", 1)[1] for k in everything if k.startswith(f"{section}.")]
    rest = ".".join(parts[1:])
    name = choices.get(section)
    if section in choices:
        owners = _owners(section, parts[1])
        if owners:
            return UserError(
                f"'{key}' is not a key of {section}={name}.{did_you_mean(rest, valid)}",
                f"{section}={', '.join(owners[:3])}{' ...' if len(owners) > 3 else ''} "
                f"{'has' if len(owners) == 1 else 'have'} it: pick one first; "
                f"`expctl show {section}={name}` lists what {name} takes",
            )
        if name and _takes_an_object(section, name, rest):
            kind = schema.COMPONENT_KINDS[section]
            return UserError(
                f"{section}.{rest}: '{name}' takes a class, function or module for '{rest}', "
                "which a config value cannot give",
                f"set it in code: @expctl.register('{kind}', 'my_{name}') on a function that "
                f"builds {name} with it, in a module listed under imports:",
            )
        return UserError(
            f"{section}.{rest}: '{name}' has no argument '{rest}'.{did_you_mean(rest, valid)} "
            f"Valid: {choices_text(valid) or '(none)'}",
            f"`expctl show {section}={name}` lists its keys",
        )
    return UserError(
        f"unknown config key '{key}'.{did_you_mean(rest, valid)} Valid under '{section}': "
        f"{choices_text(valid)}",
        "check the spelling (`expctl show` prints every key)",
    )


def _closest(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def all_keys(choices: Mapping[str, str]) -> list[str]:
    """Every SECTION and SECTION.KEY of the schema and the chosen components."""
    out: list[str] = []
    for f in dataclasses.fields(schema.Config):
        if f.name == "interpolations":
            continue
        out.append(f.name)
        if f.name in schema.FIXED:
            for k in dataclasses.fields(schema.FIXED[f.name]):
                out.append(f"{f.name}.{k.name}")
                if dataclasses.is_dataclass(k.default):  # train.early_stop.patience
                    out += [f"{f.name}.{k.name}.{n.name}" for n in dataclasses.fields(k.default)]
        elif f.name == "launcher":
            cls = schema.LAUNCHERS.get(choices.get("launcher", ""), schema.InlineLauncher)
            out += [f"launcher.{k.name}" for k in dataclasses.fields(cls)]
        elif f.name in schema.COMPONENT_KINDS:
            out += [f"{f.name}.{k}" for k in component_keys(f.name, choices.get(f.name))]
    return out


def component_keys(section: str, name: str | None) -> list[str]:
    keys = list(schema.framework_keys(section))
    if name and name != "none":
        try:
            entry = registry.get(schema.COMPONENT_KINDS[section], name)
        except UserError:
            return keys
        params = entry.parameters().items()
        keys += [k for k, p in params if k not in keys and signatures.settable(p)]
    return keys


def _takes_an_object(section: str, name: str, key: str) -> bool:
    """Whether `key` is an argument of the component that no YAML value can set (a class or
    function: torchvision's norm_layer)."""
    kind = schema.COMPONENT_KINDS.get(section)
    try:
        params = registry.get(kind, name).parameters() if kind else {}
    except UserError:
        return False
    return key in params and not signatures.settable(params[key])


def _owners(section: str, key: str) -> list[str]:
    """Choices of a group that have `key` (a launcher's keys, a component's argument)."""
    if section == "launcher":
        return [
            n for n, c in schema.LAUNCHERS.items() if key in {f.name for f in dataclasses.fields(c)}
        ]
    kind = schema.COMPONENT_KINDS[section]
    out = []
    for name in registry.names(kind):
        entry = registry.get(kind, name)
        if entry.params_of is None and key in entry.parameters():
            out.append(name)
    return out


def parse_override(text: str) -> Any:
    """One override parsed by Hydra's own parser (an ``Override``), or a UserError."""
    # Hydra off `run --help`, completion:
    from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: PLC0415
    from hydra.errors import HydraException  # noqa: PLC0415

    try:
        (o,) = OverridesParser.create().parse_overrides([text])
    except HydraException as e:
        raise UserError(
            f"bad override {text!r}: {' '.join(str(e).split())[:160]}",
            "overrides are key=value in Hydra syntax, e.g. optim.lr=0.05 or model=resnet18",
        ) from None
    if not o.key_or_group:  # Hydra's parser takes `=1`; its composition then fails (a bug)
        raise UserError(
            f"override {text!r} has no key",
            "overrides are KEY=VALUE, e.g. optim.lr=0.05 or model=resnet18",
        )
    return o
