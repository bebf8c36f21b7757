"""Reading a YAML file safely: a size limit, and a limit on the values its aliases expand to
(counted before any object is built), so a -C file, a group file or a run's config.yaml can
never keep expctl busy or fill its memory. The one place expctl parses YAML."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from expctl.errors import UserError

YAML_MAX_BYTES = 1 << 20  # a config file holds a few KB; more is a mistake or an attack
YAML_MAX_VALUES = 10_000  # nodes, aliases (*name) expanded: OmegaConf takes ~1 s per 10000


# the lists that `touched` records into, innermost last
_TOUCHED: list[list[Path]] = []


@contextlib.contextmanager
def touched() -> Iterator[list[Path]]:
    """Record every file a composition reads or looks for while inside: what `config/kept.py`
    checks before it serves a composition again."""
    files: list[Path] = []
    _TOUCHED.append(files)
    try:
        yield files
    finally:
        _TOUCHED.remove(files)


def touch(path: Path) -> Path:
    """`path` was read or looked for (`touched`); returns it."""
    for files in _TOUCHED:
        files.append(path)
    return path


def read_yaml(p: Path, where: str, empty: str | None = None) -> dict[str, Any]:
    """A YAML file (a -C file, a group file, a run's config.yaml) as a plain dict, interpolations
    unresolved.

    Args:
        empty: refuse a file that holds nothing (empty, comments only, or null) with this
            hint; None: such a file is an empty mapping (a group file naming only its option).

    Raises:
        UserError: unreadable, over 1 MiB, not YAML, not a mapping, empty (see `empty`), or
            more than 10000 values once its aliases are expanded (an alias bomb), naming the
            file and the limit.
    """
    # PyYAML and OmegaConf off `status` and `run --help`:
    import yaml  # noqa: PLC0415
    from omegaconf import OmegaConf  # noqa: PLC0415

    try:
        with open(touch(p), "rb") as f:
            data = f.read(YAML_MAX_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as e:
        raise UserError(
            f"{where}: cannot read it ({e.__class__.__name__}: {e})",
            "check the file's permissions, or point at another file",
        ) from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"{where}: not a text file (byte {e.start} is not UTF-8: {e.reason})",
            "a config is YAML text saved as UTF-8; point at the .yml file itself",
        ) from None
    if len(data) > YAML_MAX_BYTES:
        raise UserError(
            f"{where}: the file is larger than {YAML_MAX_BYTES // 2**20} MiB, the limit for a "
            "config file",
            "point -C at the YAML config itself; data belongs in files a dataset reads",
        )
    try:
        _check_expansion(text, where)
        loaded = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except UserError:
        raise
    except Exception as e:  # yaml.YAMLError, omegaconf errors, RecursionError (deep nesting)
        first = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"{where}: not valid YAML: {first}", "fix the YAML syntax") from None
    out = OmegaConf.to_container(loaded, resolve=False)
    if empty is not None and not out and yaml.safe_load(text) is None:  # `{}` is meant
        raise UserError(f"{where}: the file is empty (it holds no settings)", empty)
    if not isinstance(out, dict):
        raise UserError(
            f"{where}: the file must hold a mapping of keys, not a list or a scalar",
            "start the file with keys such as `model:` or `train:`",
        )
    return {str(k): v for k, v in out.items()}


def _has_alias(text: str) -> bool:
    import yaml  # noqa: PLC0415 - PyYAML off `status` and `run --help`

    return any(isinstance(t, yaml.AliasToken) for t in yaml.scan(text, Loader=yaml.SafeLoader))


def _too_many(where: str, aliased: bool) -> UserError:
    if not aliased:
        return UserError(
            f"{where}: more than {YAML_MAX_VALUES} values, the limit for a config file",
            "a config holds settings; lists of data belong in files a dataset reads",
        )
    return UserError(
        f"{where}: more than {YAML_MAX_VALUES} values once its aliases (*name) are expanded, "
        "the limit for a config file (an alias bomb?)",
        "write the values out, or alias small blocks only",
    )


def _check_expansion(text: str, where: str) -> None:
    """Count the values of a YAML text with its aliases expanded, on PyYAML's node graph (an
    alias is one shared node there) before any object is built: each node once, no recursion."""
    import yaml  # noqa: PLC0415 - PyYAML off `status` and `run --help`

    root = yaml.compose(text, Loader=yaml.SafeLoader)  # pure Python: deep nesting raises
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # expanded, children not yet counted: an ancestor
    stack: list[tuple[Any, bool]] = [(root, False)] if root is not None else []
    while stack:
        node, counted = stack.pop()
        kids = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else (node.value if isinstance(node, yaml.SequenceNode) else [])
        )
        if counted:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in kids)
            open_nodes.discard(id(node))
            if sizes[id(node)] > YAML_MAX_VALUES:
                raise _too_many(where, _has_alias(text))
        elif id(node) in open_nodes:
            raise UserError(
                f"{where}: an alias refers to a block that contains it (a recursive alias)",
                "remove the alias (*name) inside the block its anchor (&name) marks",
            )
        elif id(node) not in sizes:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack += [(c, False) for c in kids if id(c) not in sizes]
