"""Hydra composition, done once in the launching process: built-in conf/ + the user's -C file.

Hydra no longer searches ``.yml`` files and a primary config cannot sit outside its search path,
so the user's file is read here and rewritten as a generated primary config in a temporary
folder: its ``defaults:`` entries become overrides of the built-in ``config.yaml``'s groups, its
body becomes ``_self_``, and the folder holding it joins the search path (its own ``model/*.yaml``
and other group files are found there).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from expctl.errors import UserError, choices_text, did_you_mean

GROUPS = ("model", "data", "optim", "sched", "loss", "launcher", "sweep", "experiment")
PRIMARY = "__expctl_main__"


def builtin_conf_dir() -> Path:
    """The folder of built-in configs (``conf/`` in the repo, ``expctl/conf`` when installed)."""
    try:
        return Path(str(resources.files("expctl.conf")))
    except ModuleNotFoundError:  # a source checkout on PYTHONPATH, not installed
        return Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str, extra_dirs: Sequence[Path] = ()) -> list[str]:
    """Names of the YAML files of a config group, built-in and in `extra_dirs`."""
    names = set()
    for root in (builtin_conf_dir(), *extra_dirs):
        folder = root / group
        if folder.is_dir():
            names |= {p.stem for p in folder.glob("*.yaml")} | {
                p.stem for p in folder.glob("*.yml")
            }
    return sorted(names)


def read_user_file(path: str) -> dict[str, Any]:
    """Read a -C file (.yml or .yaml, anywhere on disk) into a plain dict, unresolved."""
    from omegaconf import OmegaConf

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
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"-C {path}: cannot read it ({e.__class__.__name__}: {e})") from None
    try:
        loaded = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except Exception as e:  # yaml.YAMLError and omegaconf errors
        first = " ".join(str(e).split())[:200]
        raise UserError(f"-C {path}: not valid YAML: {first}", "fix the YAML syntax") from None
    if not isinstance(OmegaConf.to_container(loaded, resolve=False), dict):
        raise UserError(
            f"-C {path}: the file must hold a mapping of keys, not a list or a scalar",
            "start the file with keys such as `model:` or `train:`",
        )
    return OmegaConf.to_container(loaded, resolve=False)  # type: ignore[return-value]


def _defaults_for(user: dict[str, Any], user_dir: Path) -> list[Any]:
    """The generated primary's defaults list: built-in config, then the user's choices."""
    entries: list[Any] = ["config"]
    chosen: set[str] = set()
    raw = user.pop("defaults", None) or []
    if not isinstance(raw, list):
        raise UserError("defaults: must be a list, e.g. [{model: resnet18}, _self_]")
    has_self = False
    for item in raw:
        if item == "_self_":
            has_self = True
            entries.append(item)
        elif isinstance(item, dict) and len(item) == 1:
            key, choice = next(iter(item.items()))
            group = key.removeprefix("override ").strip()
            base = group.removeprefix("optional ").strip()
            if base in GROUPS:
                _check_choice(base, choice, user_dir)
                entries.append({f"override {base}": choice})
                chosen.add(base)
            else:
                entries.append(item)
        else:
            entries.append(item)
    # `model: {name: resnet18}` in the body picks the group file of that name, so that keys of the
    # default group (cnn's `width`) do not leak into another model.
    for group in GROUPS:
        section = user.get(group)
        if group in chosen or not isinstance(section, dict) or "name" not in section:
            continue
        name = section["name"]
        if isinstance(name, str) and name in group_options(group, [user_dir]):
            entries.append({f"override {group}": name})
        else:
            entries.append({f"override {group}": None})
    if not has_self:
        entries.append("_self_")
    return entries


def _check_choice(group: str, choice: Any, user_dir: Path) -> None:
    options = group_options(group, [user_dir])
    if choice is not None and choice not in options:
        raise UserError(
            f"defaults: no '{choice}' in config group '{group}'.{did_you_mean(str(choice), options)}"
            f" Valid: {choices_text(options)}",
            f"pick one of the files in conf/{group}/ or add {group}/{choice}.yaml next to your file",
        )


@contextlib.contextmanager
def primary_config(config_file: str | None) -> Iterator[tuple[Path, str]]:
    """Yield (config dir, config name) of a primary config Hydra can compose from."""
    from omegaconf import OmegaConf

    builtin = builtin_conf_dir()
    if config_file is None:
        yield builtin, "config"
        return
    user = read_user_file(config_file)
    user_dir = Path(config_file).expanduser().resolve().parent
    from expctl.registry import add_import_path

    add_import_path(user_dir)  # `imports: [my_components]` next to the file, from anywhere
    if "hydra" in user and not isinstance(user["hydra"], dict):
        raise UserError("hydra: must be a mapping of Hydra settings")
    body = dict(user)
    defaults = _defaults_for(body, user_dir)
    hydra_section = dict(body.pop("hydra", None) or {})
    hydra_section["searchpath"] = [f"file://{builtin}", f"file://{user_dir}"] + list(
        hydra_section.get("searchpath", [])
    )
    with tempfile.TemporaryDirectory(prefix="expctl-compose-") as tmp:
        doc = {"defaults": defaults, **body, "hydra": hydra_section}
        (Path(tmp) / f"{PRIMARY}.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(doc)))
        yield Path(tmp), PRIMARY


def _rewrite_overrides(overrides: Sequence[str]) -> list[str]:
    """``model.name=resnet18`` picks the group file ``model/resnet18.yaml`` when there is one."""
    out = list(overrides)
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    for i, o in enumerate(overrides):
        key, _, value = o.partition("=")
        group = key.removesuffix(".name")
        ok = key.endswith(".name") and group in GROUPS and group not in given
        if ok and value in group_options(group):
            out[i] = f"{group}={value}"
    return out


def compose(config_file: str | None, overrides: Sequence[str]) -> dict[str, Any]:
    """Compose built-in defaults, the -C file and command-line overrides into a resolved dict.

    Raises:
        UserError: a bad file, an unknown group option or key, a malformed override.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    overrides = _rewrite_overrides(overrides)
    with primary_config(config_file) as (cdir, name), _hydra_errors(config_file, overrides):
        with initialize_config_dir(config_dir=str(cdir), version_base=None):
            cfg = hydra_compose(config_name=name, overrides=list(overrides))
        container = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


def multirun(
    config_file: str | None, overrides: Sequence[str], task: Callable[[dict[str, Any], Path], Any]
) -> None:
    """Run Hydra's multirun over `overrides`; `task(cfg, trial_dir)` runs each trial."""
    import sys

    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    overrides = _rewrite_overrides(overrides)
    with primary_config(config_file) as (cdir, name):

        @hydra.main(config_path=str(cdir), config_name=name, version_base=None)
        def _trial(cfg: DictConfig) -> Any:
            trial_dir = Path(HydraConfig.get().runtime.output_dir)
            container = OmegaConf.to_container(cfg, resolve=True)
            assert isinstance(container, dict)
            return task({str(k): v for k, v in container.items()}, trial_dir)

        argv = sys.argv
        sys.argv = [
            argv[0],
            "-m",
            *overrides,
            "hydra.output_subdir=null",
            "hydra/job_logging=none",
            "hydra/hydra_logging=none",
        ]
        try:
            with _hydra_errors(config_file, overrides):
                _trial()
        finally:
            sys.argv = argv


@contextlib.contextmanager
def _hydra_errors(config_file: str | None, overrides: Sequence[str]) -> Iterator[None]:
    """Turn Hydra's composition errors into one-or-two-line UserErrors."""
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except MissingConfigException as e:
        raise _missing_option(e) from None
    except HydraException as e:
        raise _override_error(e, config_file, overrides) from None
    except OmegaConfBaseException as e:
        msg = " ".join(str(e).split("\n")[0].split())
        raise UserError(
            f"config: {msg}", "check interpolations (${...}) and key names in the config"
        ) from None


def _missing_option(e: Exception) -> UserError:
    text = str(e)
    for group in GROUPS:
        marker = f"'{group}/"
        if marker in text:
            bad = text.split(marker, 1)[1].split("'", 1)[0]
            options = group_options(group)
            return UserError(
                f"no '{bad}' in config group '{group}'.{did_you_mean(bad, options)} "
                f"Valid: {choices_text(options)}",
                f"see conf/{group}/, or `expctl list` for registered names",
            )
    return UserError(" ".join(text.split("\n")[0].split()), "check the config group names")


def _override_error(e: Exception, config_file: str | None, overrides: Sequence[str]) -> UserError:
    text = " ".join(str(e).split())
    bad = next((o for o in overrides if "=" in o and f"'{o.split('=', 1)[0]}'" in text), None)
    if bad is not None and "Could not override" in text:
        return _unknown_key(config_file, overrides, bad.split("=", 1)[0])
    return UserError(
        f"bad override{f' {bad!r}' if bad else ''}: {text[:200]}",
        "overrides are key=value in Hydra syntax, e.g. optim.lr=0.05 or model=resnet18",
    )


def _unknown_key(config_file: str | None, overrides: Sequence[str], key: str) -> UserError:
    """An override of a key the config lacks: suggest a close key, or the group that has it."""
    rest = [o for o in overrides if not o.startswith(key + "=")]
    try:
        cfg = compose(config_file, rest)
    except UserError:
        cfg = {}
    parent, _, leaf = key.rpartition(".")
    node: Any = cfg
    for part in parent.split(".") if parent else []:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    keys = list(node) if isinstance(node, dict) else []
    group = key.split(".", 1)[0]
    owners = [
        opt for opt in group_options(group) if _group_file_has(group, opt, key.split(".", 1)[-1])
    ]
    if group in GROUPS and owners and "." in key:
        return UserError(
            f"'{key}' is not a key of the chosen {group} ({cfg.get(group, {}).get('name')})",
            f"it belongs to {group}={owners[0]} (add that override first); or set it as a new key: +{key}=VALUE",
        )
    return UserError(
        f"unknown config key '{key}'.{did_you_mean(leaf, keys)}"
        + (f" Valid under '{parent}': {choices_text(keys)}" if parent and keys else ""),
        f"check the spelling (`expctl show` prints every key); to add a new key use +{key}=VALUE",
    )


def _group_file_has(group: str, option: str, dotted: str) -> bool:
    from omegaconf import OmegaConf

    path = builtin_conf_dir() / group / f"{option}.yaml"
    absent = object()  # keys whose value is null count too (launcher.partition: null)
    try:
        return OmegaConf.select(OmegaConf.load(path), dotted, default=absent) is not absent
    except Exception:
        return False
