"""Composition, done once in the launching process: schema + presets + the -C file + overrides.

Precedence, lowest first: the schema's and each factory's signature defaults < the built-in
``conf/config.yaml`` < an ``experiment`` the -C file picks < the -C file < an ``experiment`` the
command line picks < the command line. Hydra composes the result (its ConfigStore holds the schema
and one node per registered component; OmegaConf checks types; overrides use Hydra's grammar).

One rule on top of Hydra's defaults list: a section that configures a component belongs to the
component it was written for. ``optim: {name: sgd, lr: 0.1}`` in a file is "sgd with lr 0.1";
when a later layer (the command line, say ``optim=adam`` or ``optim.name=adam``) picks another
optimizer, that section goes with sgd instead of leaking into Adam. The layers are read here and
handed to Hydra as generated group options (``optim/__expctl__.yaml: defaults: [sgd]; lr: 0.1``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from expctl import config as schema
from expctl.errors import UserError, choices_text, did_you_mean

GROUPS = ("model", "data", "optim", "sched", "loss", "launcher")
PRESETS = "experiment"  # conf/experiment/*.yaml, `# @package _global_`
FREE_MAPS = ("launcher.sbatch", "env", "sweep.params")  # keys the user adds without `+`
PRIMARY = "__expctl_main__"
GENERATED = "__expctl__"
REGISTRY_GROUP = "expctl_registry"


def builtin_conf_dir() -> Path:
    """The folder of built-in configs (``conf/`` in the repo, ``expctl/conf`` when installed)."""
    try:
        return Path(str(resources.files("expctl.conf")))
    except ModuleNotFoundError:  # a source checkout on PYTHONPATH, not installed
        return Path(__file__).resolve().parent.parent / "conf"


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
    from expctl import registry

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
    if not p.is_file():
        near = sorted(str(q) for q in p.parent.glob("*.y*ml")) if p.parent.is_dir() else []
        raise UserError(
            f"-C {path}: no such file{did_you_mean(str(p), near)}",
            "check the path (relative paths start from the current directory)",
        )
    return _read_yaml(p, f"-C {path}")


def _read_yaml(p: Path, where: str) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{where}: cannot read it ({e.__class__.__name__}: {e})") from None
    try:
        loaded = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except Exception as e:  # yaml.YAMLError and omegaconf errors
        first = " ".join(str(e).split())[:200]
        raise UserError(f"{where}: not valid YAML: {first}", "fix the YAML syntax") from None
    out = OmegaConf.to_container(loaded, resolve=False)
    if not isinstance(out, dict):
        raise UserError(
            f"{where}: the file must hold a mapping of keys, not a list or a scalar",
            "start the file with keys such as `model:` or `train:`",
        )
    return {str(k): v for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# layers: the built-in config, presets, the -C file
# ---------------------------------------------------------------------------------------------


@dataclass
class Layer:
    """What one config file says: group choices, the sections it sets, everything else."""

    source: str
    choices: dict[str, str] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    preset: str | None = None  # an experiment the file picks (applied beneath it)
    extra: list[Any] = field(default_factory=list)  # other defaults entries, for Hydra


def _layer(doc: dict[str, Any], source: str) -> Layer:
    doc = dict(doc)
    layer = Layer(source)
    raw = doc.pop("defaults", None) or []
    if not isinstance(raw, list):
        raise UserError(f"{source}: defaults must be a list, e.g. [{{model: resnet18}}, _self_]")
    for item in raw:
        if item == "_self_":
            continue
        if not (isinstance(item, dict) and len(item) == 1):
            layer.extra.append(item)
            continue
        key, choice = next(iter(item.items()))
        group = str(key).replace("override ", "").replace("optional ", "").strip().lstrip("/")
        if group in GROUPS:
            layer.choices[group] = _choice(group, choice, source)
        elif group == PRESETS:
            layer.preset = None if choice is None else str(choice)
        elif group == "sweep":  # `sweep: tpe` picks the sampler
            layer.body.setdefault("sweep", {})["sampler"] = choice
        else:
            layer.extra.append(item)
    for key, value in doc.items():
        if key not in GROUPS:
            old = layer.body.get(key)
            both = isinstance(old, dict) and isinstance(value, dict)
            layer.body[key] = _merge(old, value) if both else value  # type: ignore[arg-type]
            continue
        if isinstance(value, str) or value is None:
            value = {"name": value}
        if not isinstance(value, dict):
            raise UserError(f"{source}: {key} must be a mapping or a name, got {value!r}")
        section = dict(value)
        if "name" in section:
            named = _choice(key, section.pop("name"), source)
            if key in layer.choices and layer.choices[key] != named:
                raise UserError(
                    f"{source}: {key} is both '{layer.choices[key]}' (defaults list) and "
                    f"'{named}' ({key}.name)",
                    "name the component once",
                )
            layer.choices[key] = named
        layer.sections[key] = section
    return layer


def _choice(group: str, value: Any, source: str) -> str:
    if value is None and group == "sched":
        return "none"
    if not isinstance(value, str) or not value:
        raise UserError(
            f"{source}: {group} must name a {group} (a string), got {value!r}",
            f"e.g. {group}={'resnet18' if group == 'model' else 'NAME'}; `expctl list` shows names",
        )
    return value


def _preset_layer(name: str, dirs: Sequence[Path], source: str) -> Layer:
    for root in (*dirs, builtin_conf_dir()):
        for suffix in (".yaml", ".yml"):
            p = root / PRESETS / f"{name}{suffix}"
            if p.is_file():
                layer = _layer(_read_yaml(p, f"experiment={name}"), f"experiment={name}")
                if layer.preset:
                    raise UserError(
                        f"experiment={name} picks another experiment ({layer.preset})",
                        "presets do not nest: copy what you need into one file",
                    )
                return layer
    options = yaml_options(PRESETS, dirs)
    raise UserError(
        f"{source}: no '{name}' in config group 'experiment'.{did_you_mean(name, options)} "
        f"Valid: {choices_text(options)}",
        "presets are conf/experiment/*.yaml, or experiment/NAME.yaml next to your -C file",
    )


@dataclass
class Stack:
    """The layers merged: one choice and one section per group, the rest of the body."""

    choices: dict[str, str] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # group -> the layer that set its keys
    body: dict[str, Any] = field(default_factory=dict)
    extra: list[Any] = field(default_factory=list)

    def add(self, layer: Layer) -> None:
        for group in sorted(set(layer.choices) | set(layer.sections)):
            new = layer.choices.get(group, self.choices.get(group))
            if new != self.choices.get(group):
                self.sections[group] = {}  # another component: the old one's keys stay behind
            assert new is not None, group
            self.choices[group] = new
            if layer.sections.get(group):
                self.sections[group] = _merge(self.sections.get(group, {}), layer.sections[group])
                self.owner[group] = layer.source
        self.body = _merge(self.body, layer.body)
        self.extra += layer.extra

    def choose(self, group: str, name: str, source: str) -> str | None:
        """A later choice (the command line): returns a note when it drops a file's keys."""
        if name == self.choices.get(group):
            return None
        dropped = self.sections.get(group) or {}
        note = None
        if dropped and self.owner.get(group) != "conf/config.yaml":
            shown = ", ".join(f"{k}={v}" for k, v in list(dropped.items())[:4])
            note = (
                f"{source} {group}={name} replaces {group} '{self.choices.get(group)}' of "
                f"{self.owner[group]}, and its settings ({shown})"
            )
        self.choices[group], self.sections[group] = name, {}
        return note


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

    choices: list[tuple[str, str]] = field(default_factory=list)
    presets: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)


_HYDRA_HINTS = {
    "hydra.run.dir": "run.dir=PATH (the exact run directory) or run.root=PATH",
    "hydra.sweep.dir": "run.root=PATH (sweep directories are created under it)",
    "hydra.sweep.subdir": "run.root=PATH (trials live in SWEEP_DIR/trial_NNN)",
    "hydra.job.chdir": "nothing: expctl never changes the working directory",
    "hydra.verbose": "nothing: expctl logs its own progress",
}


def parse_command_line(overrides: Sequence[str]) -> CommandLine:
    """Sort `overrides` (Hydra's grammar, parsed by Hydra's parser)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out = CommandLine()
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except HydraException as e:
            raise UserError(
                f"bad override {text!r}: {' '.join(str(e).split())[:160]}",
                "overrides are key=value in Hydra syntax, e.g. optim.lr=0.05 or model=resnet18",
            ) from None
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            fix = next((v for k, v in _HYDRA_HINTS.items() if key.startswith(k)), None)
            raise UserError(
                f"{text}: expctl composes with Hydra but runs no Hydra app, so hydra.* settings "
                "have no effect",
                f"use {fix}" if fix else "run directories come from run.root / run.dir",
            )
        group = key.removesuffix(".name") if key.endswith(".name") else key
        if o.package is not None:
            raise UserError(f"{text}: package overrides (@) are not supported", f"use {key}=...")
        if group in GROUPS and o.type != OverrideType.DEL:
            out.choices.append((group, _choice(group, o.value(), f"{text}:")))
        elif group in GROUPS or key == PRESETS and o.type == OverrideType.DEL:
            raise UserError(
                f"{text}: a {group} cannot be deleted",
                "sched=none turns the scheduler off"
                if group == "sched"
                else f"pick another {group}",
            )
        elif key == PRESETS:
            value = o.value()
            if value is not None:
                out.presets.append(str(value))
        elif key == "sweep" and o.type != OverrideType.DEL:  # `sweep=tpe` picks the sampler
            out.keys.append(f"sweep.sampler={o.value()}")
        elif o.type == OverrideType.CHANGE and key.startswith(tuple(m + "." for m in FREE_MAPS)):
            out.keys.append("++" + text)
        elif o.type == OverrideType.ADD:  # every key exists already: `+k=v` sets it, as k=v does
            out.keys.append("+" + text)
        else:
            value = o.value()
            if key == "imports" and isinstance(value, list):
                out.imports = [str(v) for v in value]
            out.keys.append(text)
    return out


# ---------------------------------------------------------------------------------------------
# Hydra's ConfigStore: the schema, and one node per registered component
# ---------------------------------------------------------------------------------------------

_STORED: set[tuple[str, str]] = set()


def _store_schema() -> None:
    from hydra.core.config_store import ConfigStore
    from omegaconf import MISSING, OmegaConf

    if ("", "schema") in _STORED:
        return
    root = OmegaConf.create({})
    for name, cls in schema.FIXED.items():
        root[name] = _open_maps(_unfrozen(OmegaConf.structured(cls)))
    for name in GROUPS:
        root[name] = MISSING
    root["imports"] = []
    root["env"] = {}
    OmegaConf.set_struct(root["env"], False)
    cs = ConfigStore.instance()
    cs.store(name="expctl_schema", node=root)
    for name, cls in schema.LAUNCHERS.items():
        cs.store(
            group=f"{REGISTRY_GROUP}/launcher",
            name=name,
            node=_open_maps(_unfrozen(OmegaConf.structured(cls))),
        )
    cs.store(group=f"{REGISTRY_GROUP}/sched", name="none", node={"name": None, "interval": "epoch"})
    _STORED.add(("", "schema"))


def _unfrozen(node: Any) -> Any:
    """A structured node of a frozen dataclass, made writable (Hydra merges into it)."""
    from omegaconf import OmegaConf

    OmegaConf.set_readonly(node, None)
    for key in node:
        child = node._get_node(key)
        if OmegaConf.is_config(child):
            _unfrozen(child)
    return node


def _open_maps(node: Any) -> Any:
    """Dict-typed keys (sbatch, params) accept new keys without `+`."""
    from omegaconf import DictConfig, OmegaConf

    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) is dict:
            OmegaConf.set_struct(child, False)
    return node


def _store_components(choices: dict[str, str], dirs: Sequence[Path]) -> None:
    """ConfigStore nodes for the chosen registered components (stored once per process)."""
    from hydra.core.config_store import ConfigStore

    from expctl import registry

    cs = ConfigStore.instance()
    for section, kind in schema.COMPONENT_KINDS.items():
        name = choices[section]
        if (section, name) in _STORED or name in yaml_options(section, dirs) or name == "none":
            continue
        node = component_node(section, registry.get(kind, name))
        cs.store(group=f"{REGISTRY_GROUP}/{section}", name=name, node=node)
        _STORED.add((section, name))


def component_node(section: str, entry: Any) -> type:
    """A dataclass for one component: ``name``, the section's framework keys (with the entry's
    own defaults, e.g. a step-wise scheduler's interval), and the factory's YAML-settable
    arguments with their signature defaults (null: inferred from the data, or the model
    builder's own default; ``???``: required)."""
    from omegaconf import MISSING

    fields: list[tuple[str, Any, Any]] = []
    for key, f in schema.framework_keys(section).items():
        default = entry.name if key == "name" else entry.settings.get(key, f.default)
        fields.append((key, _annotation(f.type), dataclasses.field(default=default)))
    own = (
        set(inspect.signature(entry.factory).parameters) if _signature_ok(entry.factory) else set()
    )
    for p in entry.parameters().values():
        if p.name in schema.framework_keys(section) or not _settable(p):
            continue
        if p.name in entry.inferred or (p.name not in own and entry.params_of is not None):
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


def _const(value: Any) -> Any:
    import copy

    return lambda: copy.deepcopy(value)


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out[:1].isalpha() else f"c_{out}"


def _signature_ok(fn: Any) -> bool:
    try:
        inspect.signature(fn)
        return True
    except (TypeError, ValueError):
        return False


def _annotation(text: Any) -> Any:
    return {"str": str, "str | None": str | None, "int": int, "int | None": int | None}.get(
        str(text), Any
    )


_SIMPLE = {"int": int, "float": float, "bool": bool, "str": str}


def _settable(p: inspect.Parameter) -> bool:
    """Whether YAML can set the parameter: its annotation allows a plain value (not only a
    class, function, module or tensor) and its default is one."""
    from expctl.registry import settable

    return settable(p) and (p.default is p.empty or _yaml_value(p.default))


def _yaml_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_yaml_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _yaml_value(v) for k, v in value.items())
    return False


def _param_type(p: inspect.Parameter) -> Any:
    """int, float, bool or str (optional where None is allowed) when the annotation says one
    of them, else Any (the registry's signature check runs on top)."""
    from expctl.registry import _NEVER_FROM_YAML, _options

    opts = [o for o in _options(p) if o not in _NEVER_FROM_YAML]
    simple = [o for o in opts if o != "None"]
    if len(simple) != 1 or simple[0] not in _SIMPLE:
        return Any
    t = _SIMPLE[simple[0]]
    if (
        isinstance(p.default, bool)
        and t is not bool
        or p.default is not None
        and not isinstance(p.default, (t, int) if t is float else t)
    ):
        return Any
    return t | None if "None" in opts or p.default is None else t


# ---------------------------------------------------------------------------------------------
# compose
# ---------------------------------------------------------------------------------------------


def compose(
    config_file: str | None,
    overrides: Sequence[str] = (),
    notes: list[str] | None = None,
    check_components: bool = True,
) -> schema.Config:
    """Compose the built-in config, the -C file and `overrides` into a validated Config.

    Args:
        notes: when given, receives one line per file setting a command-line choice dropped.

    Raises:
        UserError: a bad file, an unknown group option or key, a malformed override.
    """
    from expctl import registry

    cli = parse_command_line(overrides)
    user = read_user_file(config_file) if config_file else None
    user_dir = Path(config_file).expanduser().resolve().parent if config_file else None
    dirs = [user_dir] if user_dir else []
    if user_dir:
        registry.add_import_path(user_dir)  # `imports: [my_components]` next to the file
    base = _layer(
        _read_yaml(builtin_conf_dir() / "config.yaml", "conf/config.yaml"), "conf/config.yaml"
    )
    stack = Stack()
    stack.add(base)
    if user is not None:
        hydra_section = user.pop("hydra", None)
        _check_hydra_section(hydra_section, str(config_file))
        layer = _layer(user, f"-C {config_file}")
        if layer.preset:
            stack.add(_preset_layer(layer.preset, dirs, f"-C {config_file}"))
        stack.add(layer)
    for name in cli.presets:
        stack.add(_preset_layer(name, dirs, f"experiment={name}:"))
    imports = cli.imports or stack.body.get("imports") or []
    registry.import_user_modules(imports if isinstance(imports, list) else [])
    for group, name in cli.choices:
        note = stack.choose(group, name, "the command line's")
        if note and notes is not None:
            notes.append(note)
    for group in GROUPS:
        _check_option(group, stack.choices[group], dirs)
    _store_schema()
    _store_components(stack.choices, dirs)
    with _generated(stack, dirs) as cdir, _hydra_errors(stack, cli.keys):
        from hydra import compose as hydra_compose
        from hydra import initialize_config_dir

        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            node = hydra_compose(config_name=PRIMARY, overrides=cli.keys)
    raw, interps = schema.resolve(node, "config")
    raw.get("sweep", {}).update(storage=None, trial=None)  # set by expctl in a trial only
    _fill_signature_defaults(raw)
    with schema.redacted(raw, interps):
        return schema.validate(raw, check_components=check_components, interpolations=interps)


def _check_hydra_section(section: Any, source: str) -> None:
    if section is None:
        return
    if not isinstance(section, dict) or set(section) - {"searchpath"}:
        raise UserError(
            f"-C {source}: a hydra: section has no effect here (expctl runs no Hydra app)",
            "remove it; run directories come from run.root / run.dir, group files next to "
            "your -C file are found without a searchpath",
        )


def _check_option(group: str, name: str, dirs: Sequence[Path]) -> None:
    if _known(group, name, dirs):
        return  # without listing every name (torchvision's load only when one is asked for)
    options = group_options(group, dirs)
    if name not in options:
        kind = schema.COMPONENT_KINDS.get(group)
        hint = (
            f"see `expctl list {kind}`; your own: @expctl.register('{kind}', '{name}') in a "
            "module listed under imports:, or a {group}/{name}.yaml next to your -C file".replace(
                "{group}", group
            ).replace("{name}", name)
            if kind
            else "launcher=inline | local | slurm"
        )
        raise UserError(
            f"no '{name}' in config group '{group}'.{did_you_mean(name, options)} "
            f"Valid: {choices_text(options)}",
            hint,
        )


def _known(group: str, name: str, dirs: Sequence[Path]) -> bool:
    if group == "launcher":
        return name in schema.LAUNCHERS
    if name in yaml_options(group, dirs) or (group == "sched" and name == "none"):
        return True
    from expctl import registry

    try:
        registry.get(schema.COMPONENT_KINDS[group], name)
        return True
    except UserError:
        return False


@contextlib.contextmanager
def _generated(stack: Stack, dirs: Sequence[Path]) -> Iterator[Path]:
    """A temporary config folder: the primary config and one generated option per group."""
    from omegaconf import OmegaConf

    defaults: list[Any] = ["expctl_schema"]
    with tempfile.TemporaryDirectory(prefix="expctl-compose-") as tmp:
        for group in GROUPS:
            name = stack.choices[group]
            base = (
                name if name in yaml_options(group, dirs) else f"/{REGISTRY_GROUP}/{group}@_here_"
            )
            entry = name if base == name else {base: name}
            doc = {"defaults": [entry, "_self_"], **stack.sections.get(group, {})}
            (Path(tmp) / group).mkdir()
            (Path(tmp) / group / f"{GENERATED}.yaml").write_text(
                OmegaConf.to_yaml(OmegaConf.create(doc))
            )
            defaults.append({group: GENERATED})
        defaults += [*stack.extra, *_QUIET_HYDRA, "_self_"]
        search = [f"file://{tmp}", f"file://{builtin_conf_dir()}", *(f"file://{d}" for d in dirs)]
        doc = {"defaults": defaults, **stack.body, "hydra": {"searchpath": search}}
        (Path(tmp) / f"{PRIMARY}.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(doc)))
        yield Path(tmp)


# Hydra's own logging and help configs: unused here, and a third of each composition's time
_QUIET_HYDRA = [
    {"override hydra/job_logging": "none"},
    {"override hydra/hydra_logging": "none"},
]


def _fill_signature_defaults(raw: dict[str, Any]) -> None:
    """A component chosen through a YAML preset holds every argument too (signature defaults)."""
    from omegaconf import MISSING, OmegaConf

    from expctl import registry

    for section, kind in schema.COMPONENT_KINDS.items():
        value = raw.get(section)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            continue
        try:
            entry = registry.get(kind, value["name"])
        except UserError:
            continue  # validation names it
        full = OmegaConf.to_container(OmegaConf.structured(component_node(section, entry)))
        assert isinstance(full, dict)
        for key, default in full.items():
            if key not in value and default != MISSING:
                value[key] = default


@contextlib.contextmanager
def _hydra_errors(stack: Stack, keys: Sequence[str]) -> Iterator[None]:
    """Turn Hydra's composition errors into one-or-two-line UserErrors."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        raise _explain(e, stack, keys) from None


def _explain(e: Exception, stack: Stack, keys: Sequence[str]) -> UserError:
    from omegaconf.errors import ConfigKeyError, ValidationError

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
    where = f"override {override!r}" if override else "the config"
    key = _key_of(override) if override else full_key
    if isinstance(cause, ValidationError):
        msg = str(cause).split("\n")[0]
        return UserError(
            f"{key}: {_type_text(msg)} ({where})",
            f"set {key} to a value of that type (`expctl show` prints every key and value)",
        )
    if "Could not delete" in text:
        return UserError(
            f"{where}: {key} does not exist, so there is nothing to delete",
            "a component picked on the command line starts from its own keys only; "
            "`expctl show` prints them",
        )
    if (
        isinstance(cause, ConfigKeyError)
        or "Could not override" in text
        or "Could not append" in text
    ):
        return unknown_key_error(key, stack)
    return UserError(
        f"{where}: {text[:200]}",
        "overrides are key=value in Hydra syntax, e.g. optim.lr=0.05 or model=resnet18",
    )


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _type_text(msg: str) -> str:
    """OmegaConf's "Value 'x' of type 'str' could not be converted to Integer" -> expected int."""
    import re

    m = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if not m:
        return msg
    want = {"Integer": "int", "Float": "float", "Boolean": "bool", "String": "str"}.get(
        m.group(3), m.group(3)
    )
    return f"expected {want}, got {m.group(1)!r}"


def unknown_key_error(key: str, stack: Stack) -> UserError:
    """A key the config lacks: did-you-mean across sections, and the component that has it."""
    parts = key.split(".")
    section, leaf = parts[0], parts[-1]
    everything = _all_keys(stack)
    same_leaf = [k for k in everything if k.rsplit(".", 1)[-1] == leaf and k != key]
    if len(parts) == 1 or section not in everything:
        sections = [k for k in everything if "." not in k]
        close = same_leaf[0] if same_leaf else None
        if close is None:
            fixed = did_you_mean_word(section, sections)
            close = f"{fixed}.{'.'.join(parts[1:])}" if fixed and len(parts) > 1 else fixed
        return UserError(
            f"unknown config key '{key}'."
            + (f" Did you mean '{close}'?" if close else "")
            + f" Sections: {choices_text(sections)}",
            f"keys are SECTION.KEY, e.g. {close or 'train.max_epochs'}=VALUE "
            "(`expctl show` prints them all)",
        )
    valid = [
        k.split(".", 1)[1] for k in everything if k.startswith(section + ".") and k.count(".") == 1
    ]
    rest = ".".join(parts[1:])
    if section in GROUPS:
        owners = _owners(section, parts[1])
        name = stack.choices.get(section)
        if owners:
            return UserError(
                f"'{key}' is not a key of {section}={name}.{did_you_mean(rest, valid)}",
                f"{section}={owners[0]} has it: pick that {section} first; "
                f"`expctl show {section}={name}` lists what {name} takes",
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


def did_you_mean_word(word: str, choices: Sequence[str]) -> str | None:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def _all_keys(stack: Stack) -> list[str]:
    """Every SECTION and SECTION.KEY of the schema and the chosen components."""
    out: list[str] = []
    for f in dataclasses.fields(schema.Config):
        if f.name == "interpolations":
            continue
        out.append(f.name)
        if f.name in schema.FIXED:
            out += [f"{f.name}.{k.name}" for k in dataclasses.fields(schema.FIXED[f.name])]
        elif f.name == "launcher":
            cls = schema.LAUNCHERS.get(stack.choices.get("launcher", ""), schema.InlineLauncher)
            out += [f"launcher.{k.name}" for k in dataclasses.fields(cls)]
        elif f.name in schema.COMPONENT_KINDS:
            out += [f"{f.name}.{k}" for k in _component_keys(f.name, stack.choices.get(f.name))]
    return out


def _component_keys(section: str, name: str | None) -> list[str]:
    from expctl import registry

    keys = list(schema.framework_keys(section))
    if name and name != "none":
        with contextlib.suppress(UserError):
            entry = registry.get(schema.COMPONENT_KINDS[section], name)
            keys += [k for k in entry.parameters() if k not in keys]
    return keys


def _owners(section: str, key: str) -> list[str]:
    """Choices of a group that have `key` (a launcher's keys, a model's argument)."""
    if section == "launcher":
        return [
            n for n, c in schema.LAUNCHERS.items() if key in {f.name for f in dataclasses.fields(c)}
        ]
    from expctl import registry

    kind = schema.COMPONENT_KINDS[section]
    out = []
    for name in registry.names(kind):
        entry = registry.get(kind, name)
        if entry.params_of is None and key in entry.parameters():
            out.append(name)
    return out


# ---------------------------------------------------------------------------------------------
# help and shell completion
# ---------------------------------------------------------------------------------------------


def groups_text(config_file: str | None = None) -> str:
    """Every config group and its options, as a Hydra app's --help lists them."""
    import textwrap

    dirs = [Path(config_file).expanduser().resolve().parent] if config_file else []
    lines = ["config groups (GROUP=NAME picks one; GROUP.KEY=VALUE sets its keys):"]
    for group in (*GROUPS, PRESETS):
        options = group_options(group, dirs)
        text = f"{group} ({len(options)}): {', '.join(options)}"
        lines += textwrap.wrap(text, 100, initial_indent="  ", subsequent_indent="      ")
    sections = ", ".join(schema.FIXED) + ", imports, env"
    lines.append(f"sections with fixed keys: {sections} (`expctl show` prints every key)")
    return "\n".join(lines)


def completion_words() -> list[str]:
    """What the shell completes on the command line: GROUP=NAME and SECTION.KEY= words."""
    words = [f"{group}={name}" for group in (*GROUPS, PRESETS) for name in group_options(group)]
    for section, cls in (*schema.FIXED.items(), ("launcher", schema.LauncherConfig)):
        words += [f"{section}.{f.name}=" for f in dataclasses.fields(cls)]
    for section in schema.COMPONENT_KINDS:
        words += [f"{section}.{k}=" for k in schema.framework_keys(section)]
    return sorted(set(words))


def completion_script(parser: Any, shell: str) -> str:
    """A completion script for `shell`, generated by shtab from the argument parser, with the
    config groups, their options and the schema's keys for KEY=VALUE arguments."""
    try:
        import shtab
    except ImportError:
        raise UserError("shell completion needs shtab", "pip install shtab") from None
    words = " ".join(completion_words())
    preamble = {
        "bash": f'_expctl_overrides() {{ compgen -W "{words}" -- "$1"; }}',
        "zsh": f"_expctl_overrides() {{ compadd -S '' -- {words}; }}",
    }
    return str(shtab.complete(parser, shell=shell, preamble=preamble))  # type: ignore[arg-type]
