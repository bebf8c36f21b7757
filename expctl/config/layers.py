"""The layers of a config, lowest first: the built-in ``conf/config.yaml``, an ``experiment``
preset, the -C file (read here: `read_user_file`), each sorted into a Layer (the components it
picks, their settings, the rest), and the Stack they merge into; the options of each group.

The rule these keep on top of Hydra's defaults list: settings belong to the component they were
written for. ``optim: {name: sgd, lr: 0.1}`` in a file is "sgd with lr 0.1"; a Stack holds
settings per (group, component), so when a later layer picks ``optim=adam`` those settings stay
with sgd instead of leaking into Adam, and they come back whenever sgd is the optimizer.
`compose.py` composes the Stack with Hydra.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from expctl import registry
from expctl.config import confstore, frozen, schema
from expctl.config.yamlfile import read_yaml, touch
from expctl.errors import UserError, choices_text, did_you_mean

GROUPS = ("model", "data", "optim", "sched", "loss", "launcher")
PRESETS = "experiment"  # conf/experiment/*.yaml (or experiment/ next to the -C file)
LOGGER = "logger"  # several at once: logger=[tensorboard,csv]
BUILTIN = "conf/config.yaml"


def builtin_conf_dir() -> Path:
    """The folder of built-in configs (``expctl/conf``)."""
    return Path(__file__).resolve().parents[1] / "conf"


def yaml_options(group: str, dirs: Sequence[Path] = ()) -> list[str]:
    """Names of the YAML files of a config group, built-in and in `dirs`."""
    names: set[str] = set()
    for root in (builtin_conf_dir(), *dirs):
        folder = touch(root / group)
        if folder.is_dir():
            names |= {p.stem for p in folder.glob("*.y*ml") if p.suffix in (".yaml", ".yml")}
    return sorted(names)


def group_options(group: str, dirs: Sequence[Path] = ()) -> list[str]:
    """Every choice of a config group: registered names and YAML presets."""
    if group == "launcher":
        return sorted(schema.LAUNCHERS)
    if group == PRESETS:
        return yaml_options(group, dirs)
    names = set(registry.names(schema.COMPONENT_KINDS[group])) | set(yaml_options(group, dirs))
    return sorted(names | ({"none"} if group == "sched" else set()))


def read_user_file(path: str) -> dict[str, Any]:
    """Read a -C file (.yml or .yaml, anywhere on disk) into a plain dict, unresolved."""
    p = touch(Path(path).expanduser())
    if p.suffix not in (".yml", ".yaml"):
        raise UserError(
            f"-C {path}: config files must end in .yml or .yaml",
            "rename the file or point -C at a YAML file",
        )
    if p.exists() and not p.is_file():  # a folder, a FIFO, a device (/dev/zero)
        kind = "a folder" if p.is_dir() else "not a regular file"
        raise UserError(f"-C {path}: {kind}", "point -C at a .yml file")
    if not p.is_file():
        near = sorted(str(q) for q in p.parent.glob("*.y*ml")) if p.parent.is_dir() else []
        near = [q for q in near if q != str(p)]  # a broken link names itself
        raise UserError(
            f"-C {path}: no such file.{did_you_mean(str(p), near)}",
            "check the path (relative paths start from the current directory)",
        )
    return read_yaml(
        p, f"-C {path}", empty="write settings into it, or leave -C out for the defaults"
    )


def _option_file(root: Path, group: str, option: str, suffix: str) -> Path:
    """GROUP/OPTION.yaml under `root`: an option names a file there, never a path elsewhere
    (`experiment=../../x`, `experiment=/etc/x`).

    Raises:
        UserError: the option holds '..' or starts at the root.
    """
    parts = PurePosixPath(option).parts
    if option.startswith(("/", "~", "\\")) or ".." in parts or "\\" in option:
        raise UserError(
            f"{group}={option}: a name from conf/{group}/ (or {group}/ next to your -C file), "
            "not a path",
            f"put the file in {group}/ next to your -C file and name it: {group}=NAME",
        )
    return touch(root / group / f"{option}{suffix}")


@dataclass
class Layer:
    """What one config file says: components it picks, settings, everything else."""

    source: str
    choices: dict[str, str] = field(default_factory=dict)  # group -> registered name
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> its settings
    body: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None  # an experiment the file picks (applied beneath it)
    loggers: list[str] | None = None  # the loggers the file picks (None: it names none)


def read_layer(doc: dict[str, Any], source: str, dirs: Sequence[Path]) -> Layer:
    """Sort a config file's defaults list and body into a Layer."""
    doc = dict(doc)
    frozen.drop_legacy(doc)  # a 0.1 trial's config.yaml used with -C
    layer = Layer(source)
    raw = doc.pop("defaults", None) or []
    if not isinstance(raw, list):
        raise UserError(
            f"{source}: defaults must be a list", "e.g. defaults: [{model: resnet18}, _self_]"
        )
    for item in raw:
        if item == "_self_":
            continue
        key, choice = (
            next(iter(item.items())) if isinstance(item, dict) and len(item) == 1 else ("", None)
        )
        group = str(key).replace("override ", "").replace("optional ", "").strip().lstrip("/")
        if group in GROUPS:
            _pick(layer, group, choice, dirs, {})
        elif group == PRESETS:
            layer.preset = None if choice is None else str(choice)
        elif group == "sweep":  # `sweep: tpe` picks the sampler
            layer.body = _merge(layer.body, {"sweep": {"sampler": choice}})
        elif group == LOGGER:
            _pick_loggers(layer, choice)
        else:
            raise UserError(
                f"{source}: defaults entry {item!r} is not one of expctl's groups",
                f"groups: {', '.join((*GROUPS, PRESETS, 'sweep'))}; other keys go in the body",
            )
    for key, value in doc.items():
        if key == "hydra":
            raise UserError(
                f"{source}: a hydra: section has no effect here (expctl runs no Hydra app)",
                "remove it; run directories come from run.root / run.dir, and group files next "
                "to your -C file (model/NAME.yaml) are found without a searchpath",
            )
        if key == LOGGER:
            _pick_loggers(layer, value)
            continue
        if key not in GROUPS:
            layer.body = _merge(layer.body, {key: value})
            continue
        if isinstance(value, str) or value is None:
            value = {"name": value}
        if not isinstance(value, dict):
            raise UserError(
                f"{source}: {key} must be a mapping or a name, got {value!r}",
                f"e.g. {key}: {{name: NAME, ...its arguments}}",
            )
        section = dict(value)
        if "name" in section:
            _pick(layer, key, section.pop("name"), dirs, section)
        else:
            layer.sections[key] = _merge(layer.sections.get(key, {}), section)
    return layer


def read_layers(doc: dict[str, Any], source: str, dirs: Sequence[Path]) -> list[Layer]:
    """A config file as layers, lowest first: its defaults list up to ``_self_`` with its body,
    then the entries after ``_self_``, which beat the body (Hydra's rule; without ``_self_``
    the body comes last)."""
    raw = doc.get("defaults")
    if not isinstance(raw, list) or "_self_" not in raw:
        return [read_layer(doc, source, dirs)]
    if raw.count("_self_") > 1:
        raise UserError(
            f"{source}: defaults lists _self_ twice",
            "list it once, where the file's own settings go: last (they win) or first",
        )
    at = raw.index("_self_")
    layers = [read_layer({**doc, "defaults": raw[:at]}, source, dirs)]
    if raw[at + 1 :]:
        layers.append(read_layer({"defaults": raw[at + 1 :]}, source, dirs))
    return layers


def _pick(
    layer: Layer, group: str, choice: Any, dirs: Sequence[Path], keys: dict[str, Any]
) -> None:
    name, preset = resolve_option(group, choice_of(group, choice, layer.source), dirs)
    if group in layer.choices and layer.choices[group] != name:
        raise UserError(
            f"{layer.source}: {group} is both '{layer.choices[group]}' and '{name}'",
            f"name the {group} once (in the defaults list or as {group}.name)",
        )
    layer.choices[group] = name
    layer.sections[group] = _merge(_merge(layer.sections.get(group, {}), preset), keys)


def _pick_loggers(layer: Layer, value: Any) -> None:
    """`logger: [a, b]` picks loggers; `logger: {a: {key: value}}` also sets their arguments."""
    if isinstance(value, dict):
        layer.body = _merge(layer.body, {LOGGER: {k: v or {} for k, v in value.items()}})
        value = list(value)
    layer.loggers = logger_names(value, layer.source)


def logger_names(value: Any, source: str) -> list[str]:
    """The names of ``logger=[a,b]`` (a name alone, or null: none)."""
    names = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise UserError(
            f"{source} logger must list logger names, got {value!r}",
            "e.g. logger=[tensorboard,csv]; `expctl list loggers` names them",
        )
    return names


def choice_of(group: str, value: Any, source: str) -> str:
    if value is None and group == "sched":
        return "none"
    if not isinstance(value, str) or not value:
        raise UserError(
            f"{source} {group} must name a {group} (a string), got {value!r}",
            f"e.g. {group}={'resnet18' if group == 'model' else 'NAME'}; `expctl list` shows names",
        )
    return value


def resolve_option(group: str, option: str, dirs: Sequence[Path]) -> tuple[str, dict[str, Any]]:
    """A group option as (registered name, settings): a YAML file GROUP/OPTION.yaml next to the
    -C file holds a registered ``name`` (default: OPTION) and settings; otherwise the option is
    the registered name itself."""
    for root in (*dirs, builtin_conf_dir()):
        for suffix in (".yaml", ".yml"):
            p = _option_file(root, group, option, suffix)
            if not p.is_file():
                continue
            doc = read_yaml(p, str(p))
            if "defaults" in doc:
                raise UserError(
                    f"{p}: a group file holds `name:` and settings, not a defaults list",
                    f"write `name: REGISTERED_NAME` and the {group} settings",
                )
            name = doc.pop("name", option)
            return choice_of(group, name, f"{p}:"), doc
    return option, {}


def preset_layers(name: str, dirs: Sequence[Path], source: str) -> list[Layer]:
    for root in (*dirs, builtin_conf_dir()):
        for suffix in (".yaml", ".yml"):
            p = _option_file(root, PRESETS, name, suffix)
            if p.is_file():
                doc = read_yaml(p, f"experiment={name}")
                layers = read_layers(doc, f"experiment={name}", dirs)
                for layer in layers:
                    if layer.preset:
                        raise UserError(
                            f"experiment={name} picks another experiment ({layer.preset})",
                            "presets do not nest: copy what you need into one file",
                        )
                return layers
    options = yaml_options(PRESETS, dirs)
    raise UserError(
        f"{source} no '{name}' in config group 'experiment'.{did_you_mean(name, options)} "
        f"Valid: {choices_text(options)}",
        "presets are conf/experiment/*.yaml, or experiment/NAME.yaml next to your -C file",
    )


@dataclass
class Stack:
    """The layers merged: the chosen component per group, settings per component, the body."""

    choices: dict[str, str] = field(default_factory=dict)
    settings: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    loggers: list[str] = field(default_factory=list)  # the last layer's pick

    def add(self, layer: Layer) -> None:
        for group in sorted(set(layer.choices) | set(layer.sections)):
            name = layer.choices.get(group, self.choices.get(group))
            assert name is not None, group
            self.choices[group] = name
            if layer.sections.get(group):
                self.settings.setdefault((group, name), []).append(
                    (layer.source, layer.sections[group])
                )
        self.body = _merge(self.body, layer.body)
        if layer.loggers is not None:
            self.loggers = layer.loggers

    def chosen_loggers(self) -> dict[str, dict[str, Any]]:
        """Each picked logger with its arguments: its signature's defaults, then what the
        layers set (settings of loggers not picked stay aside, as a component's do)."""
        settings = self.body.get(LOGGER) or {}
        out = {}
        for name in self.loggers:
            entry = registry.get("loggers", name)
            out[name] = _merge(confstore.node_defaults(LOGGER, entry), settings.get(name) or {})
        return out

    def section(self, group: str) -> dict[str, Any]:
        """The settings of the chosen component, merged from every layer that set them."""
        out: dict[str, Any] = {}
        for _, keys in self.settings.get((group, self.choices[group]), []):
            out = _merge(out, keys)
        return out

    def set_aside(self, before: dict[str, str]) -> list[str]:
        """One line per group whose component changed since `before`, naming the settings of
        the files that now stay with the old component."""
        notes = []
        for group, old in before.items():
            new = self.choices[group]
            kept = [(s, k) for s, k in self.settings.get((group, old), []) if s != BUILTIN]
            if new == old or not kept:
                continue
            shown = ", ".join(f"{k}={v}" for _, keys in kept for k, v in list(keys.items())[:4])
            sources = ", ".join(sorted({s for s, _ in kept}))
            notes.append(
                f"{group}={new} sets aside {group} '{old}' and its settings from {sources} "
                f"({shown})"
            )
        return notes


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------


def check_option(group: str, name: str, dirs: Sequence[Path]) -> None:
    if _known(group, name):
        return  # without listing every name (torchvision's load only when one is asked for)
    options = group_options(group, dirs)
    kind = schema.COMPONENT_KINDS.get(group)
    hint = (
        f"see `expctl list {kind}`; your own: @expctl.register('{kind}', '{name}') in a module "
        f"listed under imports:, or a {group}/{name}.yaml next to your -C file"
        if kind
        else "launcher=inline | local | slurm"
    )
    raise UserError(
        f"no '{name}' in config group '{group}'.{did_you_mean(name, options)} "
        f"Valid: {choices_text(options)}",
        hint,
    )


def _known(group: str, name: str) -> bool:
    if group == "launcher":
        return name in schema.LAUNCHERS
    if group == "sched" and name == "none":
        return True
    try:
        registry.get(schema.COMPONENT_KINDS[group], name)
        return True
    except UserError:
        return False
