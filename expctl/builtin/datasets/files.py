"""Where a built-in dataset's files are, and the error when they are not. No torch: the
pre-flight checks that use them run in `expctl show`, which loads none."""

from __future__ import annotations

from pathlib import Path

from expctl.errors import UserError


def not_found(name: str, root: str | Path, expected: str, download: bool = True) -> UserError:
    """The error for a dataset whose files are missing under `root`."""
    fetch = ", or set data.download=true to fetch it (needs internet)" if download else ""
    return UserError(
        f"data={name}: not found under {root} (expected {expected})",
        f"point data.root at the folder holding it{fetch}",
    )


def root_of(root: str | None) -> Path:
    return Path(root or "data").expanduser()
