"""`expctl list`, fast: the text of every registered component, kept in the user's cache folder.

Listing imports every built-in component module, torch and torchvision's models (seconds: they
pull in torch._dynamo). The text depends only on the code that registers the names, so it is kept
once per set of versions: Python, torch, torchvision and expctl's own source files (their sizes
and modification times). What else can register a name is never cached: ``--import`` modules,
installed plugins (``expctl.plugins`` entry points), anything registered in this process before.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from expctl import registry
from expctl.layout import cache_dir, cache_key, cache_write

_PREFIX = "list-"


def listing(kinds: Sequence[str]) -> str:
    """What `expctl list` prints for `kinds` (canonical kind names): from the cache when only
    expctl's own modules can register names (`registry.pristine`), else made here."""
    path = _cache_file() if registry.pristine() else None
    texts = _read(path) if path is not None else None
    if texts is None:
        texts = {kind: render(kind) for kind in (registry.KINDS if path else kinds)}
        if path is not None:
            _write(path, texts)
    return "".join(texts[kind] for kind in kinds)


def render(kind: str) -> str:
    """One kind's section: each name with its description, then its settable arguments."""
    lines = [f"{kind}:"]
    for name in registry.names(kind):
        entry = registry.get(kind, name)
        lines.append(f"  {name:<28} {entry.description}")
        sig = registry.describe(entry)
        if sig:
            lines.append(f"  {'':<28}   ({sig})")
    return "\n".join(lines) + "\n"


def key() -> str:
    """What the listing is made of: Python, torch, torchvision, expctl's source files (its
    version among them: __init__.py)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = [sys.version]
    for dist in ("torch", "torchvision"):
        try:
            versions.append(version(dist))
        except PackageNotFoundError:
            versions.append("")
    return cache_key(versions, sorted(Path(__file__).resolve().parent.rglob("*.py")))


def _cache_file() -> Path:
    return cache_dir() / f"{_PREFIX}{key()}.json"


def _read(path: Path) -> dict[str, str] | None:
    """The cached texts, or None when absent or unreadable (then they are made again)."""
    try:
        texts = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(texts, dict) or set(texts) != set(registry.KINDS):
        return None
    return {str(k): str(v) for k, v in texts.items()}


def _write(path: Path, texts: dict[str, str]) -> None:
    """Store the texts atomically, replacing those of other versions; a cache that cannot be
    written is no error (the next listing makes the texts again)."""
    stale = list(path.parent.glob(f"{_PREFIX}*.json")) if path.parent.is_dir() else []
    cache_write(path, [json.dumps(texts).encode()], stale)
