"""What sweep.json must hold: the keys and types every reader takes from it, checked when
`layout.SweepDir.read_spec` reads it (resuming: also those that make a trial's config), so that a
damaged or hand-edited file is one error naming it, not a traceback in whichever command read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from expctl.errors import UserError


def _damaged_spec(path: Path, why: str) -> UserError:
    return UserError(
        f"{path} is damaged ({why})",
        "the trials' folders (trial_NNN/) still hold their results: `expctl runs` lists them",
    )


# what `sweep resume` makes a trial's config from (a table reads sweeps without some of them)
_MAKES_TRIALS = ("config_file", "plain", "dims", "points")


def _checked_spec(path: Path, spec: Any) -> dict[str, Any]:
    """A sweep.json as `expctl run -m` writes it: points a list of mappings, counts integers,
    the -C file a path or null, the plain overrides a list of strings."""
    if not isinstance(spec, dict):
        raise _damaged_spec(path, f"a {type(spec).__name__}, not a mapping")
    checks = {
        "points": lambda v: isinstance(v, list) and all(isinstance(p, dict) for p in v),
        "repeat": lambda v: isinstance(v, int) and v >= 1,
        "n_trials": lambda v: isinstance(v, int) and v >= 0,
        "config_file": lambda v: isinstance(v, str),
        "plain": lambda v: isinstance(v, list) and all(isinstance(o, str) for o in v),
        "dims": lambda v: (
            isinstance(v, list) and all(isinstance(d, dict) and "key" in d for d in v)
        ),
        "config_sha256": lambda v: isinstance(v, str),
    }
    for key, ok in checks.items():
        if spec.get(key) is not None and not ok(spec[key]):
            raise _damaged_spec(path, f"{key}: {str(spec[key])[:40]!r}")
    return spec


def read(path: Path, resuming: bool = False) -> dict[str, Any]:
    """The sweep.json at `path`, checked (see `layout.SweepDir.read_spec`).

    Raises:
        UserError: it cannot be read, or is not what `expctl run -m` wrote.
    """
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise _damaged_spec(path, " ".join(str(e).split())[:120]) from None
    spec = _checked_spec(path, spec)
    if not resuming:
        return spec
    missing = [k for k in _MAKES_TRIALS if k not in spec]
    if spec.get("config_file") is not None and not spec.get("config_sha256"):
        missing.append("config_sha256")  # the check that its -C file is unchanged
    if missing:
        raise _damaged_spec(path, f"no {missing[0]!r}")
    return spec
