"""The frozen config: RUN_DIR/config.yaml written (`to_yaml`) and read back (`load`), configs
frozen by older versions (`drop_legacy`), dotted keys (`flatten`), and the ``${...}``
interpolations: resolved in this process, written back unresolved, never shown in an error.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from expctl.config.schema import Config, key_path, lookup, set_leaf
from expctl.config.validate import validate
from expctl.config.yamlfile import read_yaml
from expctl.errors import UserError
from expctl.layout import RunDir


def to_yaml(cfg: Config, frozen: bool = True) -> str:
    """The config as YAML text. Frozen (config.yaml) leaves ``run.dir`` out: a run directory is
    where its config.yaml lies (a moved run resumes there; the file reused with -C starts a new
    run)."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `status` and `run --help`

    d = cfg.to_dict()
    if frozen:
        d["run"]["dir"] = None
    return OmegaConf.to_yaml(OmegaConf.create(d))


def load(run_dir: str | Path, path: Path | None = None) -> Config:
    """Read RUN_DIR/config.yaml (or another frozen config of that run, `path`) back into a
    Config (no composition, no Hydra); environment interpolations resolve in this process's
    environment."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - OmegaConf off `status` and `run --help`

    path = path or RunDir(run_dir).config
    if not path.is_file():
        raise UserError(
            f"{run_dir}: not a run directory (no {RunDir.CONFIG})",
            "pass the folder printed at the start of a run",
        )
    node = OmegaConf.create(
        read_yaml(path, str(path), empty="restore it from a copy, or start a new run elsewhere")
    )
    raw, interps = resolve(node, f"{path}")
    drop_legacy(raw)
    run = RunDir(Path(run_dir))
    if run.result.exists() or run.checkpoint_files():
        legacy_counts(raw)
    with redacted(raw, interps):
        cfg = validate(raw, check_components=False, interpolations=interps)
    return cfg.replace("run", dir=str(Path(run_dir).expanduser().absolute()))


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys -> values (`{"optim": {"lr": 0.1}}` -> `optim.lr`); lists
    and empty mappings are values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


LEGACY_KEYS = ("storage", "trial")  # sweep.*, written into trials' configs before 0.2


def drop_legacy(raw: dict[str, Any]) -> None:
    """Forget the runtime keys that configs frozen by expctl 0.1 hold (a trial's identity now
    lives in RUN_DIR/trial.json)."""
    sweep = raw.get("sweep")
    if isinstance(sweep, dict):
        for key in LEGACY_KEYS:
            sweep.pop(key, None)


def legacy_counts(raw: dict[str, Any]) -> None:
    """Read a `data.val_split` count that a run frozen as a float (N.0: before 0.2, a float of 1
    or more meant a count) as the count it was. Only for a run that started: a config of this
    version never starts with one (N.0 is refused), while a -C file or a trial's config just
    written says what its user wrote, which is checked as written."""
    data = raw.get("data")
    split = data.get("val_split") if isinstance(data, dict) else None
    if isinstance(data, dict) and isinstance(split, float) and split >= 1 and split.is_integer():
        data["val_split"] = int(split)  # typed float up to 0.2.0.dev0: a count N was frozen as N.0


def resolve(node: Any, where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """A resolved plain dict of an OmegaConf node, and the dotted keys whose values come from
    ``${oc.env:...}`` (directly or through another key), with their unresolved text."""
    # OmegaConf off `status` and `run --help`:
    from omegaconf import OmegaConf  # noqa: PLC0415
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    raw = OmegaConf.to_container(node, resolve=False)
    found: dict[str, str] = {}
    _interpolations("", raw, found)
    try:
        resolved = OmegaConf.to_container(node, resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as e:
        unset = re.search(r"Environment variable '([A-Za-z0-9_]+)' not found", str(e))
        if unset:
            raise _unset_variable(unset.group(1), found, where) from None
        msg = " ".join(str(e).split("\n")[0].split())
        for name in set(re.findall(r"oc\.env:([A-Za-z0-9_]+)", " ".join(found.values()))):
            value = os.environ.get(name)
            if value:  # never print what the environment holds
                msg = msg.replace(value, f"${{oc.env:{name}}}")
        raise UserError(
            f"{where}: {msg}", "check ${...} interpolations; ${oc.env:NAME} needs NAME set"
        ) from None
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}, _from_environment(raw, found, resolved)


_ENV_RESOLVER = re.compile(r"\boc\.env(?=\s*:)")
_PROBE = "expctl.env_probe"


def _from_environment(raw: Any, found: dict[str, str], resolved: Any) -> dict[str, str]:
    """The interpolated keys whose values depend on the environment, however they reach it
    (``${oc.env:..}``, a key that holds one, ``oc.select``, a relative key, ``oc.dict.values``,
    a parent node): those whose value changes when every ``oc.env`` returns one of its own."""
    # OmegaConf off `status` and `run --help`:
    from omegaconf import OmegaConf  # noqa: PLC0415
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    if not any(_ENV_RESOLVER.search(v) for v in found.values()):
        return {}  # no oc.env anywhere (run.name's default interpolates too): nothing to probe
    if not OmegaConf.has_resolver(_PROBE):
        count = iter(range(1 << 62))
        OmegaConf.register_new_resolver(
            _PROBE, lambda *_: f"expctl-env-probe-{next(count)}-{os.urandom(8).hex()}"
        )
    probe = copy.deepcopy(raw)
    for dotted, text in found.items():
        *parents, leaf = key_path(dotted)
        set_leaf(lookup(probe, parents), leaf, _ENV_RESOLVER.sub(_PROBE, text))
    try:
        probed = OmegaConf.to_container(OmegaConf.create(probe), resolve=True)
    except OmegaConfBaseException:  # a resolver that takes only real values: keep all unresolved
        return dict(found)

    def changed(a: Any, b: Any) -> bool:  # the schema made 5 of "5": the same value
        return a != b and str(a) != str(b)

    return {
        k: v
        for k, v in found.items()
        if "oc.env" in v or changed(lookup(resolved, key_path(k)), lookup(probed, key_path(k)))
    }


def _unset_variable(name: str, interpolated: dict[str, str], where: str) -> UserError:
    keys = [k for k, v in interpolated.items() if f"oc.env:{name}" in v.replace(" ", "")]
    return UserError(
        f"{keys[0] if keys else where}: ${{oc.env:{name}}} needs the environment variable "
        f"{name}, which is not set",
        f"set it first (export {name}=...), or give a default: ${{oc.env:{name},VALUE}}",
    )


@contextlib.contextmanager
def redacted(raw: dict[str, Any], interpolations: dict[str, str]) -> Iterator[None]:
    """A UserError raised inside never shows a value that came from the environment: each is
    replaced by its ``${oc.env:...}`` text."""
    try:
        yield
    except UserError as e:
        message, hint = e.message, e.hint or ""
        for dotted, text in interpolations.items():
            value = lookup(raw, key_path(dotted))
            if value is not None and str(value):
                for shown in {str(value), repr(str(value))}:
                    message, hint = message.replace(shown, text), hint.replace(shown, text)
        raise UserError(message, hint or None) from None


def _interpolations(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _interpolations(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _interpolations(f"{prefix}[{i}]", v, out)
    elif isinstance(value, str) and "${" in value:
        out[prefix] = value
