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
Adam, and they come back whenever sgd is the optimizer. The layers are read by `layers.py`, and
Hydra gets one generated option per group
(``optim/__expctl__.yaml: defaults: [adam node]; lr: ...``).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from expctl import dist, importpath, registry
from expctl.config import confstore, frozen, schema, validate
from expctl.config.explain import explain, parse_override
from expctl.config.layers import (
    BUILTIN,
    GROUPS,
    LOGGER,
    PRESETS,
    Layer,
    Stack,
    builtin_conf_dir,
    check_option,
    choice_of,
    logger_names,
    preset_layers,
    read_layer,
    read_layers,
    read_user_file,
    resolve_option,
)
from expctl.config.yamlfile import read_yaml, touch
from expctl.errors import UserError
from expctl.layout import RunDir, read_imports

FREE_MAPS = ("launcher.sbatch", "env", "sweep.params")  # keys the user adds without `+`
PRIMARY = "__expctl_main__"
GENERATED = "__expctl__"


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
    # Hydra off load_model and the workers (api, launch import this):
    from hydra.core.override_parser.types import OverrideType  # noqa: PLC0415

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
            out.choices[group] = choice_of(group, o.value(), f"{text}:")
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
    found = read_imports(touch(dirs[0] / RunDir.IMPORTS)) if dirs else {}
    folders = [*dirs, *(Path(f["path"]) for f in found.values())]
    for folder in folders:  # `imports: [my_components]` next to the file, here and in workers
        dist.apply_env({importpath.IMPORT_PATH: importpath.add_import_path(folder)})
    stack = Stack()
    stack.add(read_layer(read_yaml(builtin_conf_dir() / "config.yaml", BUILTIN), BUILTIN, dirs))
    for layer in read_layers(user, f"-C {config_file}", dirs) if user is not None else []:
        if layer.preset:  # beneath the part of the file that picks it
            for part in preset_layers(layer.preset, dirs, f"-C {config_file}:"):
                stack.add(part)
        stack.add(layer)
    before = dict(stack.choices)
    for name in cli.presets:
        for part in preset_layers(name, dirs, f"experiment={name}:"):
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
        check_option(group, stack.choices[group], dirs)
    confstore.store_schema(GROUPS)
    confstore.store_components(stack.choices)
    with _generated(stack) as cdir, _hydra_errors(stack, cli.keys):
        # Hydra off load_model and the workers (api, launch import this):
        from hydra import compose as hydra_compose  # noqa: PLC0415
        from hydra import initialize_config_dir  # noqa: PLC0415

        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            node = hydra_compose(config_name=PRIMARY, overrides=cli.keys)
    return _Composed(node, stack, notes)


def _finish(node: Any, stack: Stack, check_components: bool) -> schema.Config:
    """The Config of Hydra's composed node: resolved, paths made absolute, checked."""
    raw, interps = frozen.resolve(node, "config")
    _absolute_paths(raw, interps)
    _check_logger_keys(raw, stack.loggers)
    confstore.complete(raw)
    with frozen.redacted(raw, interps):
        return validate.validate(raw, check_components=check_components, interpolations=interps)


def _plain_values(overrides: Sequence[str], vary: Collection[str]) -> list[str]:
    """The overrides of `vary`'s keys when each is a plain `key=value` of a config key that no
    other override touches (then setting it last, on Hydra's composition of the others, is
    what Hydra does); else [] (compose it whole)."""
    if not vary:
        return []
    # Hydra off load_model and the workers (api, launch import this):
    from hydra.core.override_parser.types import OverrideType  # noqa: PLC0415

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
    # Hydra off load_model and the workers (api, launch import this):
    from hydra.errors import HydraException  # noqa: PLC0415

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


# Hydra's own logging configs: unused here, and a third of each composition's time
_QUIET_HYDRA = [
    {"override hydra/job_logging": "none"},
    {"override hydra/hydra_logging": "none"},
]


@contextlib.contextmanager
def _generated(stack: Stack) -> Iterator[Path]:
    """A temporary config folder: the primary config and one generated option per group."""
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
    # Hydra off load_model and the workers (api, launch import this):
    from hydra.errors import HydraException  # noqa: PLC0415

    try:
        yield
    except (HydraException, OmegaConfBaseException) as e:
        raise explain(e, stack.choices, keys) from None
