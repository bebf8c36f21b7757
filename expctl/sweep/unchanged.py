"""A sweep's config unchanged since it started: sweep.json keeps the -C file's digest, what the
files it composes made of the first point, and each grid point's config digest; `sweep resume`
and every trial the driver freezes compose them again, and refuse what composes otherwise (the
sweep would mix two configurations).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from expctl.config import frozen as config_mod
from expctl.config.schema import Config
from expctl.errors import UserError
from expctl.sweep import ledger
from expctl.sweep.plan import compose_point, point_overrides

# a grid up to this many points keeps each point's config digest (sweep.json's size)
_DIGESTS_UP_TO = 10_000


def point_digests(
    config_file: str | None, plain: list[str], points: list[dict[str, Any]]
) -> dict[str, str]:
    """Each grid point's composed config, as a digest by its values (composed already: cached)."""
    if len(points) > _DIGESTS_UP_TO:
        return {}
    return {
        _point_key(p): config_digest(compose_point(config_file, point_overrides(plain, p)))
        for p in points
    }


def check_point(spec: dict[str, Any], number: int, point: dict[str, Any], cfg: Config) -> None:
    """Trial `number`'s config (of grid point `point`) is what the sweep composed at its start.

    Raises:
        UserError: a file it composes changed (one only this point uses: its config group).
    """
    then = (spec.get("point_digests") or {}).get(_point_key(point))
    if then is not None and then != config_digest(cfg):
        raise UserError(
            f"trial {number}'s config ({' '.join(f'{k}={v}' for k, v in point.items())}) composes "
            "otherwise now than when the sweep started: a file it composes (a config group it "
            "picks, beside the -C file) was edited; the sweep would mix two configurations",
            "restore the files as they were, or start a new sweep (`expctl run -m ...`)",
        )


def _point_key(point: dict[str, Any]) -> str:
    return json.dumps(point, sort_keys=True, default=str)


def config_digest(cfg: Config) -> str:
    return hashlib.sha256(config_mod.to_yaml(cfg).encode()).hexdigest()[:16]


def digest(config_file: str | None) -> str | None:
    """The SHA-256 of the -C file's text (None without one, or when it is gone)."""
    if config_file is None:
        return None
    try:
        return hashlib.sha256(Path(config_file).read_bytes()).hexdigest()
    except OSError:
        return None


def check_unchanged(spec: dict[str, Any]) -> None:
    """A sweep's trials all come from the -C file, and every file it composes (a config group
    beside it, a built-in default), as they were when the sweep started.

    Raises:
        UserError: naming what changed.
    """
    now = digest(spec["config_file"])
    if spec["config_file"] and now is None and spec.get("config_sha256"):
        raise UserError(
            f"-C {spec['config_file']} is gone: the sweep's trials are composed from it",
            "put it back at that path as it was (the trials' own config.yaml hold its values), "
            "or start a new sweep (`expctl run -m ...`)",
        )
    then = spec.get("base")  # sweeps from before it was kept: the -C file's digest only
    if isinstance(then, dict) and isinstance(then.get("config"), dict):
        _check_base(spec["config_file"], then)  # names the values (a comment changes none)
        return
    if now != spec.get("config_sha256", now):
        raise UserError(
            f"-C {spec['config_file']} changed since the sweep started: its trials would mix "
            "two configurations",
            "restore the file as it was, or start a new sweep (`expctl run -m ...`)",
        )


def _check_base(config_file: str | None, then: dict[str, Any]) -> None:
    # composed once a process (a driver composed it at the start: no cost per trial it makes)
    now_cfg = compose_point(config_file, list(then.get("overrides") or []), notes=[]).to_dict()
    old_flat, new_flat = config_mod.flatten(then["config"]), config_mod.flatten(now_cfg)
    changed = [
        k for k in sorted(old_flat.keys() | new_flat.keys()) if old_flat.get(k) != new_flat.get(k)
    ]
    if changed:
        said = "; ".join(
            f"{k}={old_flat.get(k)} then, {new_flat.get(k)} now" for k in changed[:3]
        ) + ("; ..." if len(changed) > 3 else "")
        raise UserError(
            f"the sweep's config changed since it started ({said}): a file it composes (a "
            "config group beside the -C file, or a default) was edited; its trials would mix "
            "two configurations",
            "restore the files as they were, or start a new sweep (`expctl run -m ...`)",
        )


def point_config(spec: dict[str, Any], point: dict[str, Any]) -> Config:
    """Grid point `point` of the sweep `spec`, composed as its first seed's trial is."""
    return compose_point(spec["config_file"], point_overrides(spec["plain"], point))


def check_points(spec: dict[str, Any], rows: list[ledger.Row]) -> None:
    """The grid points not started yet compose as they did when the sweep started.

    Raises:
        UserError: naming the first that does not.
    """
    for r in rows:
        if r.optuna_trial is None and not r.seed_idx and spec.get("points"):
            point = json.loads(r.config)
            check_point(spec, r.number, point, point_config(spec, point))
