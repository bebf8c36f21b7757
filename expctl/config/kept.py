"""`expctl show`'s composition, kept between commands: a `show` that composes what an earlier
one composed, from the same files, answers without Hydra (issue 29: read-only commands in under
half a second).

A kept composition is used only when everything it came from is as it was:
- the command line (-C path, overrides), the working directory and the EXPCTL_* variables;
- every file the composition read or looked for (`yamlfile.touched`: the -C file, the built-in
  and the user's group files and presets, the names it tried and did not find), stamped with
  size, mtime, inode and ctime (`cache.file_stamp`);
- expctl's own files and the folders of installed packages (on `sys.path`: an install or an
  upgrade changes them; the built-in components' description is made from these).
What can change without any of these changing is checked again on every use, on the kept
Config: the cross-section checks (a checkpoint to resume must exist) and each component's
pre-flight check (a dataset's files). A composition is not kept when it read the environment
(`${oc.env:...}`) or imported code (`imports:`, an `imports.json` beside the -C file, plugins):
those compose afresh every time. `run` never uses this: it always composes afresh.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pickle
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from expctl import cache, layout
from expctl.config import validate
from expctl.config.schema import Config

FOLDER = "show"
KEEP = 64  # kept compositions: the most recent ones, whatever they were for
_FORMAT = 1


def compose(
    config_file: str | None, overrides: Sequence[str], notes: list[str]
) -> tuple[Config, str]:
    """The Config of `config_file` and `overrides` and its YAML text (unfrozen), kept or
    composed (`compose.compose`); `notes` receives compose's notes either way.

    Raises:
        UserError: as `compose.compose` (nothing is kept for a composition that fails).
    """
    entry = _entry(config_file, overrides)
    kept = _read(entry)
    if kept is not None:
        cfg, text, kept_notes = kept
        validate.recheck(cfg)
        notes += kept_notes
        return cfg, text
    # Hydra and OmegaConf: only when nothing is kept (what this module saves)
    from expctl.config import compose as composer  # noqa: PLC0415 - Hydra off a kept `show`
    from expctl.config import frozen  # noqa: PLC0415 - OmegaConf off a kept `show`
    from expctl.config.yamlfile import touched  # noqa: PLC0415 - PyYAML off a kept `show`

    own: list[str] = []
    with touched() as files:
        cfg = composer.compose(config_file, overrides, notes=own)
    text = frozen.to_yaml(cfg, frozen=False)
    notes += own
    stamps = _stamps([*files, *_environment()])
    if _keepable(cfg, files, overrides) and all(stamp != "?" for _, stamp in stamps):
        payload = base64.b64encode(pickle.dumps(cfg)).decode()
        value = {
            "files": stamps,
            "config": payload,
            "yaml": text,
            "notes": own,
            "sum": _sum(payload, text, own),
        }
        cache.cache_write(entry, [json.dumps(value).encode()], _oldest(entry.parent))
    return cfg, text


def _entry(config_file: str | None, overrides: Sequence[str]) -> Path:
    """Where the composition of this command line, here, is kept."""
    said = {
        "format": _FORMAT,
        "python": sys.executable,
        "cwd": os.getcwd(),
        "config": config_file and os.path.abspath(config_file),
        "overrides": list(overrides),
        "path": sys.path,
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith("EXPCTL_")),
    }
    name = hashlib.sha256(json.dumps(said).encode()).hexdigest()[:24]
    return cache.cache_dir() / FOLDER / f"{name}.json"


def _sum(payload: str, text: str, notes: list[str]) -> str:
    return hashlib.sha256(json.dumps([payload, text, notes]).encode()).hexdigest()


def _read(entry: Path) -> tuple[Config, str, list[str]] | None:
    """The kept (Config, YAML text, notes) when every stamp still holds; None for anything
    else, a damaged entry included (then it is composed afresh and written again)."""
    kept = cache.read_kept(entry)
    try:
        for path, stamp in kept["files"]:
            if cache.file_stamp(Path(path)) != stamp:
                return None
        payload, text, notes = kept["config"], kept["yaml"], kept["notes"]
        if kept["sum"] != _sum(payload, text, notes):
            return None
        cfg = pickle.loads(base64.b64decode(payload))
    except Exception:  # noqa: BLE001 - whatever is wrong with a kept entry, compose afresh
        return None
    if not isinstance(cfg, Config) or not isinstance(text, str) or not isinstance(notes, list):
        return None
    return cfg, text, [str(n) for n in notes]


# a resolver call in a value (`${now:%H%M%S}`, `${oc.env:X}`): its value may differ next time
_RESOLVER = re.compile(r"\$\{\s*[A-Za-z_][\w.]*\s*:")


def _keepable(cfg: Config, files: list[Path], overrides: Sequence[str]) -> bool:
    if cfg.imports or cfg.interpolations:
        return False
    if any(_RESOLVER.search(o) for o in overrides):
        return False
    for f in files:
        if f.suffix in (".yaml", ".yml") and f.is_file():
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if _RESOLVER.search(f.read_text()):
                    return False
    if any(f.name == layout.RunDir.IMPORTS and f.exists() for f in files):
        return False
    from importlib.metadata import entry_points  # noqa: PLC0415 - only when keeping

    return not list(entry_points(group="expctl.plugins"))


def _environment() -> Iterator[Path]:
    """The files and folders besides the config's own that a composition depends on."""
    package = Path(__file__).resolve().parents[1]
    for folder, subdirs, names in os.walk(package):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        yield Path(folder)
        yield from (Path(folder) / n for n in names if n.endswith((".py", ".yaml", ".json")))
    yield from (Path(p) for p in sys.path if p and os.path.isdir(p))


def _stamps(files: Sequence[Path]) -> list[list[str]]:
    seen: dict[str, str] = {}
    for f in files:
        seen.setdefault(str(f), cache.file_stamp(f))
    return [[path, stamp] for path, stamp in seen.items()]


def _oldest(folder: Path) -> list[Path]:
    """Kept compositions beyond the newest KEEP - 1: removed as a new one is written."""
    try:
        kept = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    except OSError:
        return []
    return kept[: max(0, len(kept) - (KEEP - 1))]
