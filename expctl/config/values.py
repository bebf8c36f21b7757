"""Checks of values that leave the config: a name that becomes a file or folder, a path's
length, text bound for an environment variable or a job script, and every launcher=slurm value
bound for the sbatch script. `validate.py` calls them on every config; `jobs/slurm.py` and the
API on what they write.
"""

from __future__ import annotations

import os
import re
from typing import Any

from expctl.config.schema import Config, LauncherConfig
from expctl.errors import CONTROL, UserError

_NAME_CHARS = re.compile(r"[A-Za-z0-9_.+=-]+")


def plain_text(where: str, value: str | None) -> None:
    """Refuse control characters (NUL, newline, tab, ...) in a value bound for a file name, an
    environment variable or a line of a job script, naming the value quoted on one line."""
    if value is not None and CONTROL.search(value):
        raise UserError(
            f"{where}={value!r}: control characters (NUL, newline, tab, ...) cannot go into a "
            "file name, an environment variable or a job script",
            f"remove them from {where}",
        )


def check_name(where: str, name: str) -> None:
    """A name that becomes a file or folder name: letters, digits and _ . + = - only.

    Raises:
        UserError: anything else ('/', '..', spaces, quotes, shell characters).
    """
    if not _NAME_CHARS.fullmatch(name) or name.startswith(".") or ".." in name:
        raise UserError(
            f"{where}={name!r}: it becomes a file or folder name and may only hold "
            "ASCII letters, digits and _ . + = - (no '/', '..', spaces, quotes, shell characters "
            "or accents)",
            f"pick a plain name, e.g. {where}=resnet18-lr0.1"
            + ("; use run.root / run.dir for the place" if where == "run.name" else ""),
        )


def check_path_length(where: str, path: str | None, inside: int = 0) -> None:
    """A folder whose files' paths fit the system's limits: each name at most NAME_MAX bytes,
    the whole (absolute, with `inside` bytes of what goes in it) under PATH_MAX.

    Raises:
        UserError: too long, before anything is created.
    """
    if path is None:
        return
    limits = []
    for name, default in (("PC_PATH_MAX", 4096), ("PC_NAME_MAX", 255)):
        try:
            limits.append(os.pathconf("/", name))
        except (OSError, ValueError):
            limits.append(default)
    full = os.fsencode(os.path.abspath(os.path.expanduser(path)))
    longest = max((len(part) for part in full.split(b"/")), default=0)
    if len(full) + inside >= limits[0] or longest > limits[1]:
        raise UserError(
            f"{where} is too long here ({len(full)} bytes, a name of {longest}): a run's files "
            f"need paths under {limits[0]} bytes and names of at most {limits[1]}",
            f"pick a shorter {where}",
        )


# what reaches an sbatch script: values from a strict character set (submitit quotes them too)
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9_.,:+@%=/\[\]-]+")
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9_-]*")
SBATCH_MANAGED = frozenset(
    {
        "signal",
        "requeue",
        "output",
        "error",
        "open-mode",
        "array",
        "nodes",
        "ntasks-per-node",
        "time",
    }
)


def check_slurm(cfg: Config) -> None:
    """Every launcher=slurm value bound for the sbatch script is safe there: checked when the
    config is validated, before `expctl show` prints anything or a job is written."""
    ln = cfg.launcher
    tasks_per_node(ln)
    for key, value in ln.sbatch.items():
        option = str(key).replace("_", "-")
        if not _SBATCH_KEY.fullmatch(option) or option in SBATCH_MANAGED:
            raise UserError(
                f"{'launcher.sbatch.' + str(key)!r}: not an sbatch option expctl lets you set here",
                "use lowercase option names (e.g. mail-type); nodes, time, signal and requeue "
                "have their own keys",
            )
        sbatch_value(f"launcher.sbatch.{option}", value)
    sbatch_value("launcher.job_name", ln.job_name or cfg.run.name)
    for key in ("cpus_per_task", "partition", "account", "qos", "constraint"):
        if getattr(ln, key) is not None:
            sbatch_value(f"launcher.{key}", getattr(ln, key))
    for i, line in enumerate(ln.setup):
        plain_text(f"launcher.setup[{i}]", str(line))


def sbatch_value(where: str, value: Any) -> Any:
    """`value` if it may go on an #SBATCH line (a number, or text of safe characters)."""
    if isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, str) or not _SBATCH_VALUE.fullmatch(value):
        raise UserError(
            f"{where}={value!r}: sbatch values may only hold letters, digits and "
            "_ . , : + @ % = / [ ] -",
            "remove spaces, quotes, ';', '$', backquotes and newlines from the value",
        )
    return value


def tasks_per_node(ln: LauncherConfig) -> int:
    """Slurm tasks per node: launcher.tasks_per_node, else one per GPU (or 1 without GPUs)."""
    tasks = ln.tasks_per_node or (ln.gpus_per_node or 1)
    if ln.gpus_per_node and tasks != ln.gpus_per_node:
        raise UserError(
            f"launcher.tasks_per_node={tasks} but launcher.gpus_per_node={ln.gpus_per_node}",
            f"use one task per GPU: launcher.tasks_per_node={ln.gpus_per_node} (or leave it null)",
        )
    return tasks
