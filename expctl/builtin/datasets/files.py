"""Where a built-in dataset's files are, the error when they are not, and the factory of each
source of in-memory images (its arguments stated once, in `in_memory_args`). No torch: the
pre-flight checks that use them run in `expctl show`, which loads none."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from expctl.errors import UserError

if TYPE_CHECKING:
    from expctl.builtin.data import Splits


def not_found(name: str, where: str, expected: str, download: bool = True) -> UserError:
    """The error for a dataset whose files are missing under `where`: the absolute path (or paths)
    looked at, as `root_text` names data.root."""
    fetch = ", or set data.download=true to fetch it (needs internet)" if download else ""
    return UserError(
        f"data={name}: not found under {where} (expected {expected})",
        f"point data.root at the folder holding it{fetch}",
    )


DEFAULT_ROOT = "data"  # data.root=null: ./data, from the current directory


def root_of(root: str | None) -> Path:
    return Path(root or DEFAULT_ROOT).expanduser()


def root_text(root: str | None) -> str:
    """data.root as an error names it: the absolute path looked at, and that null led there."""
    where = str(root_of(root).absolute())
    return f"{where} (data.root=null: the default, ./{DEFAULT_ROOT})" if root is None else where


def in_memory_args(
    root: str | None = None,
    download: bool = False,
    normalize: str = "standard",
    val_split: int | float = 0,
    subset: int | None = None,
) -> None:
    """The arguments every source of in-memory images takes (`in_memory_factory`)."""


def in_memory_factory(name: str, read: Callable[..., Any], doc: str) -> Callable[..., Splits]:
    """The registered factory of one source of in-memory images: `in_memory_args`, with the
    source's own arguments (those of `read` beyond root and download) after `root`.

    Args:
        read: ``read(root, download, **own)`` -> (train, test, classes, num_classes): uint8
            images and labels of each split (test: None when there is none), as
            `tensors.in_memory` takes them.
    """
    shared = list(inspect.signature(in_memory_args).parameters.values())
    own = list(inspect.signature(read).parameters.values())[2:]
    signature = inspect.Signature([shared[0], *own, *shared[1:]], return_annotation="Splits")

    def make(*args: Any, **kwargs: Any) -> Splits:
        bound = signature.bind(*args, **kwargs)  # a TypeError as the signature's own would be
        bound.apply_defaults()
        a = bound.arguments
        train, test, classes, num_classes = read(
            a["root"], a["download"], **{p.name: a[p.name] for p in own}
        )
        from expctl.builtin.datasets.tensors import in_memory  # noqa: PLC0415 - torch off `show`

        return in_memory(
            train, test, a["normalize"], a["val_split"], a["subset"], classes, num_classes
        )

    make.__signature__ = signature  # type: ignore[attr-defined]  # what inspect and the registry read
    make.__name__ = make.__qualname__ = name
    make.__module__ = read.__module__
    make.__doc__ = doc
    return make
