"""Composition, done once in the launching process: schema + presets + the -C file + overrides.

Precedence, lowest first: the schema's and each factory's signature defaults < the built-in
``conf/config.yaml`` < an ``experiment`` the -C file picks < the -C file < an ``experiment`` the
command line picks < the command line. Within the -C file, defaults entries after ``_self_`` beat
its body, as in Hydra. Hydra composes the result: its ConfigStore holds the schema
and one node per registered component (`confstore.py`), OmegaConf checks the types, and overrides
use Hydra's grammar.

One rule on top of Hydra's defaults list: settings belong to the component they were written
for. ``optim: {name: sgd, lr: 0.1}`` in a file is "sgd with lr 0.1"; when the command line picks
``optim=adam`` (or ``optim.name=adam``), those settings stay with sgd instead of leaking into
Adam, and they come back whenever sgd is the optimizer. The layers are read here, and Hydra gets
one generated option per group (``optim/__expctl__.yaml: defaults: [adam node]; lr: ...``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from expctl import dist, importpath, registry
from expctl.config import confstore, schema
from expctl.config.explain import explain, parse_override
from expctl.config.yamlfile import read_yaml
from expctl.errors import UserError, choices_text, did_you_mean
from expctl.layout import RunDir, read_imports

GROUPS = ("model", "data", "optim", "sched", "loss", "launcher")
PRESETS = "experiment"  # conf/experiment/*.yaml (or experiment/ next to the -C file)
LOGGER = "logger"  # several at once: logger=[tensorboard,csv]
FREE_MAPS = ("launcher.sbatch", "env", "sweep.params")  # keys the user adds without `+`
PRIMARY = "__expctl_main__"
GENERATED = "__expctl__"
BUILTIN = "conf/config.yaml"


def builtin_conf_dir() -> Path:
    """The folder of built-in configs (``expctl/conf``)."""
    return Path(__file__).resolve().parents[1] / "conf"


def yaml_options(group: str, dirs: Sequence[Path] = ()) -> list[str]:
    """Names of the YAML files of a config group, built-in and in `dirs`."""
    names: set[str] = set()
    for root in (builtin_conf_dir(), *dirs):
        folder = root / group
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
    p = Path(path).expanduser()
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
    return root / group / f"{option}{suffix}"


# ---------------------------------------------------------------------------------------------
# layers: the built-in config, presets, the -C file
# ---------------------------------------------------------------------------------------------


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
    schema.drop_legacy(doc)  # a 0.1 trial's config.yaml used with -C
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
    name, preset = resolve_option(group, _choice(group, choice, layer.source), dirs)
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


def _choice(group: str, value: Any, source: str) -> str:
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
            return _choice(group, name, f"{p}:"), doc
    return option, {}


def _preset_layers(name: str, dirs: Sequence[Path], source: str) -> list[Layer]:
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


@dataclass
class CommandLine:
    """Overrides sorted by what they do: group choices, presets, and key overrides for Hydra."""

    choices: dict[str, str] = field(default_factory=dict)  # the last choice per group
    presets: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    loggers: list[str] | None = None


_HYDRA_HINTS = {
    "hydra.run.dir": "run.dir=PATH (the exact run directory) or run.root=PATH",
    "hydra.sweep.dir": "run.root=PATH (sweep directories are created under it)",
    "hydra.sweep.subdir": "run.root=PATH (trials live in SWEEP_DIR/trial_NNN)",
    "hydra.job.chdir": "nothing: expctl never changes the working directory",
    "hydra.verbose": "nothing: expctl logs its own progress",
}


def parse_command_line(overrides: Sequence[str]) -> CommandLine:
    """Sort `overrides` (Hydra's grammar, parsed by Hydra's parser)."""
    from hydra.core.override_parser.types import OverrideType

    out = CommandLine()
    for text in overrides:
        o = parse_override(text)
        key = o.key_or_group
        group = key.removesuffix(".name")
        deleting = o.type == OverrideType.DEL
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            fix = next((v for k, v in _HYDRA_HINTS.items() if key.startswith(k)), None)
            raise UserError(
                f"{text}: expctl composes with Hydra but runs no Hydra app, so hydra.* settings "
                "have no effect",
                f"use {fix}" if fix else "run directories come from run.root / run.dir",
            )
        if o.package is not None:
            raise UserError(f"{text}: package overrides (@) are not supported", f"use {key}=...")
        if deleting:
            raise UserError(
                f"{text}: deleting is not supported here",
                "sched=none turns the scheduler off"
                if group == "sched"
                else f"set it instead ({key}=VALUE); `expctl show` prints every key and default",
            )
        if group in GROUPS:
            out.choices[group] = _choice(group, o.value(), f"{text}:")
        elif key == LOGGER:
            out.loggers = logger_names(o.value(), f"{text}:")
        elif key == PRESETS:
            if o.value() is not None:
                out.presets.append(str(o.value()))
        elif key == "sweep":  # `sweep=tpe` picks the sampler
            out.keys.append(f"sweep.sampler={o.value()}")
        elif key.startswith(tuple(m + "." for m in FREE_MAPS)) or o.type == OverrideType.ADD:
            # maps take new keys; every other key exists already, so `+k=v` sets it as k=v does
            out.keys.append("++" + text.lstrip("+"))
        else:
            value = o.value()
            if key == "imports" and isinstance(value, list):
                out.imports = [str(v) for v in value]
            out.keys.append(text)
    return out


# ---------------------------------------------------------------------------------------------
# compose
# ---------------------------------------------------------------------------------------------


def compose(
    config_file: str | None,
    overrides: Sequence[str] = (),
    notes: list[str] | None = None,
    check_components: bool = True,
    vary: Collection[str] = (),
) -> schema.Config:
    """Compose the built-in config, the -C file and `overrides` into a validated Config.

    Args:
        notes: when given, receives one line per group whose file settings an override set
            aside (another component was picked).
        vary: keys whose values differ from call to call (a sweep's points). Hydra composes the
            other overrides once per process; each call sets its values of these keys on a copy
            of that, as Hydra's own overrides do (`_set_values`), in a fifth of the time.

    Raises:
        UserError: a bad file, an unknown group option or key, a malformed override.
    """
    varied = _plain_values(overrides, vary)
    if varied:
        rest = [text for text in overrides if text not in varied]
        where = str(Path(config_file).absolute()) if config_file else None
        key = (where, str(Path.cwd()), tuple(rest))
        if key not in _STEMS:
            _STEMS[key] = _compose_node(config_file, rest)
        stem = _STEMS[key]
        node = _set_values(stem.node, varied)
        if node is not None:  # else Hydra composes it whole and names what is wrong
            if notes is not None:
                notes += stem.notes
            return _finish(node, stem.stack, check_components)
    whole = _compose_node(config_file, overrides)
    if notes is not None:
        notes += whole.notes
    return _finish(whole.node, whole.stack, check_components)


@dataclass
class _Composed:
    """Hydra's composed node (unresolved), the layers it came from and compose's notes."""

    node: Any
    stack: Stack
    notes: list[str]


# Hydra's composition of a sweep's fixed overrides, per -C file, directory and those overrides
_STEMS: dict[tuple[str | None, str, tuple[str, ...]], _Composed] = {}


def _compose_node(config_file: str | None, overrides: Sequence[str]) -> _Composed:
    cli = parse_command_line(overrides)
    user = read_user_file(config_file) if config_file else None
    dirs = [Path(config_file).expanduser().resolve().parent] if config_file else []
    # a run's config.yaml or a sweep's best.yml: where its `imports:` were found, beside it
    found = read_imports(dirs[0] / RunDir.IMPORTS) if dirs else {}
    folders = [*dirs, *(Path(f["path"]) for f in found.values())]
    for folder in folders:  # `imports: [my_components]` next to the file, here and in workers
        dist.apply_env({importpath.IMPORT_PATH: importpath.add_import_path(folder)})
    stack = Stack()
    stack.add(read_layer(read_yaml(builtin_conf_dir() / "config.yaml", BUILTIN), BUILTIN, dirs))
    for layer in read_layers(user, f"-C {config_file}", dirs) if user is not None else []:
        if layer.preset:  # beneath the part of the file that picks it
            for part in _preset_layers(layer.preset, dirs, f"-C {config_file}:"):
                stack.add(part)
        stack.add(layer)
    before = dict(stack.choices)
    for name in cli.presets:
        for part in _preset_layers(name, dirs, f"experiment={name}:"):
            stack.add(part)
    imports = cli.imports or stack.body.get("imports") or []
    registry.import_user_modules(imports if isinstance(imports, list) else [], found)
    for group, option in cli.choices.items():
        name, preset = resolve_option(group, option, dirs)
        stack.add(Layer("the command line", {group: name}, {group: preset} if preset else {}))
    if cli.loggers is not None:
        stack.loggers = cli.loggers
    notes = stack.set_aside(before)
    stack.body[LOGGER] = stack.chosen_loggers()
    for group in GROUPS:
        _check_option(group, stack.choices[group], dirs)
    confstore.store_schema(GROUPS)
    confstore.store_components(stack.choices)
    with _generated(stack) as cdir, _hydra_errors(stack, cli.keys):
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            node = hydra_compose(config_name=PRIMARY, overrides=cli.keys)
    return _Composed(node, stack, notes)


def _finish(node: Any, stack: Stack, check_components: bool) -> schema.Config:
    """The Config of Hydra's composed node: resolved, paths made absolute, checked."""
    raw, interps = schema.resolve(node, "config")
    _absolute_paths(raw, interps)
    _check_logger_keys(raw, stack.loggers)
    confstore.complete(raw)
    with schema.redacted(raw, interps):
        return schema.validate(raw, check_components=check_components, interpolations=interps)


def _plain_values(overrides: Sequence[str], vary: Collection[str]) -> list[str]:
    """The overrides of `vary`'s keys when each is a plain `key=value` of a config key that no
    other override touches (then setting it last, on Hydra's composition of the others, is
    what Hydra does); else [] (compose it whole)."""
    if not vary:
        return []
    from hydra.core.override_parser.types import OverrideType

    parsed = [(text, parse_override(text)) for text in overrides]
    varied = [text for text, o in parsed if o.key_or_group in vary]
    keys = [o.key_or_group for _, o in parsed]
    for text, o in parsed:
        if text not in varied:
            continue
        key = o.key_or_group
        if (
            o.type != OverrideType.CHANGE
            or o.package is not None
            or key.removesuffix(".name") in GROUPS  # picks a component
            or key.split(".")[0] in (PRESETS, LOGGER, "imports", "sweep", "hydra")
            or key.startswith(tuple(m + "." for m in FREE_MAPS))
            or sum(_overlap(key, other) for other in keys) != 1  # itself only
        ):
            return []
    return varied


def _overlap(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _set_values(stem: Any, varied: Sequence[str]) -> Any:
    """A copy of Hydra's composed `stem` with `varied` set as Hydra sets a `key=value` override
    on the composed config (`OmegaConf.update(cfg, key, value, merge=True)`, in struct mode);
    None when one fails (Hydra's composition then says why, in its words)."""
    import copy

    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node = copy.deepcopy(stem)
    try:
        for text in varied:
            o = parse_override(text)
            OmegaConf.update(node, o.key_or_group, o.value(), merge=True)
    except (HydraException, OmegaConfBaseException, UserError):
        return None
    return node


PATH_KEYS = ("data.root", "checkpoint.init", "checkpoint.resume")
ARRAYS_PATH_KEYS = ("data.train", "data.val", "data.test")  # data=arrays: its files


def _absolute_paths(raw: dict[str, Any], interps: dict[str, str]) -> None:
    """Make the relative file paths a user wrote absolute, from the current directory: the frozen
    config then names the same files wherever its run is continued, evaluated or loaded."""
    keys = PATH_KEYS + (ARRAYS_PATH_KEYS if (raw.get("data") or {}).get("name") == "arrays" else ())
    for dotted in keys:
        section, key = dotted.split(".")
        value = (raw.get(section) or {}).get(key)
        if not isinstance(value, str) or dotted in interps or value in ("", "auto", "never", "???"):
            continue
        path = Path(value).expanduser()
        if not path.is_absolute():
            raw[section][key] = str(path.absolute())
    mlflow = ((raw.get("logger") or {}).get("mlflow") or {}).get("tracking_uri")
    if (
        isinstance(mlflow, str)
        and mlflow.startswith("sqlite:///")
        and "logger.mlflow.tracking_uri" not in interps
    ):
        file = Path(mlflow[len("sqlite:///") :]).expanduser()  # sqlite:////abs is already absolute
        raw["logger"]["mlflow"]["tracking_uri"] = f"sqlite:///{file.absolute()}"


def _check_logger_keys(raw: dict[str, Any], picked: list[str]) -> None:
    """A ``logger.NAME.KEY=VALUE`` override names a logger that the run uses."""
    for name in raw.get(LOGGER) or {}:
        if name not in picked:
            shown = ",".join([*picked, name])
            raise UserError(
                f"logger.{name}: sets a logger this run does not use (logger=[{','.join(picked)}])",
                f"pick it too: logger=[{shown}]",
            )


def _check_option(group: str, name: str, dirs: Sequence[Path]) -> None:
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


# Hydra's own logging configs: unused here, and a third of each composition's time
_QUIET_HYDRA = [
    {"override hydra/job_logging": "none"},
    {"override hydra/hydra_logging": "none"},
]


@contextlib.contextmanager
def _generated(stack: Stack) -> Iterator[Path]:
    """A temporary config folder: the primary config and one generated option per group."""
    from omegaconf import OmegaConf

    defaults: list[Any] = [confstore.SCHEMA]
    with tempfile.TemporaryDirectory(prefix="expctl-compose-") as tmp:
        for group in GROUPS:
            node = {f"/{confstore.REGISTRY_GROUP}/{group}@_here_": stack.choices[group]}
            doc = {"defaults": [node, "_self_"], **stack.section(group)}
            (Path(tmp) / group).mkdir()
            (Path(tmp) / group / f"{GENERATED}.yaml").write_text(
                OmegaConf.to_yaml(OmegaConf.create(doc))
            )
            defaults.append({group: GENERATED})
        defaults += [*_QUIET_HYDRA, "_self_"]
        doc = {"defaults": defaults, **stack.body}
        (Path(tmp) / f"{PRIMARY}.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(doc)))
        yield Path(tmp)


@contextlib.contextmanager
def _hydra_errors(stack: Stack, keys: Sequence[str]) -> Iterator[None]:
    """Turn Hydra's composition errors into one-or-two-line UserErrors."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        raise explain(e, stack.choices, keys) from None
