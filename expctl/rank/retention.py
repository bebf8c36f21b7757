"""The checkpoints a run keeps: listing them (newest first), the validation metrics beside each
and their ranking by ``checkpoint.monitor``, and pruning to ``checkpoint.keep`` (the best K by the
monitor, plus the newest), where none is deleted before its checksum is verified (`unverified`).
What a checkpoint holds, and how it is written and read, is checkpoint.py's.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from expctl.atomic import remove
from expctl.config.schema import CheckpointConfig
from expctl.layout import RunDir, checkpoint_digest, checkpoint_scores, checkpoint_set
from expctl.rank import sharded

log = logging.getLogger("expctl")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run, newest first."""
    return RunDir(run_dir).checkpoint_files()


def prune(run_dir: Path, ckpt_cfg: CheckpointConfig) -> None:
    """Delete the checkpoints `ckpt_cfg.keep` does not keep, each only once its checksum is verified:
    one that fails (damaged, or its .sha256 edited) may hold the only copy of its weights."""
    files = list_checkpoints(run_dir)
    if ckpt_cfg.monitor is None:
        kept = set(files[: ckpt_cfg.keep])
    else:
        kept = {*files[:1], *ranked(files, ckpt_cfg.monitor, ckpt_cfg.mode)[: ckpt_cfg.keep]}
    for old in files:
        if old in kept:
            continue
        problem = unverified(old)
        if problem is not None:
            log.warning(
                "checkpoint %s is kept beyond checkpoint.keep=%d: %s; it is never deleted "
                "unverified (remove it yourself once you know it is not needed)",
                old,
                ckpt_cfg.keep,
                problem,
            )
            continue
        for file in checkpoint_set(old):
            remove(file)


def unverified(path: Path) -> str | None:
    """Why the checksum beside checkpoint `path` does not prove it intact (None: it does)."""
    digest_file = checkpoint_digest(path)
    if path.is_dir() and digest_file.is_file():
        return sharded.problem(path)
    try:
        expected = digest_file.read_text(errors="replace").split()[:1]
    except FileNotFoundError:
        return f"it has no {digest_file.name}"
    except OSError as e:
        return f"cannot read {digest_file.name} ({e.strerror or e})"
    try:
        actual = sharded.file_sha256(path)
    except OSError as e:
        return f"cannot read it ({e.strerror or e})"
    return None if expected == [actual] else "checksum mismatch"


def scores(path: Path) -> dict[str, float]:
    """The validation metrics of a checkpoint's weights ({} when none ran at its step, or for a
    checkpoint written before they were recorded)."""
    try:
        record = json.loads(checkpoint_scores(path).read_text())
        return {str(k): float(v) for k, v in dict(record.get("val") or {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def ranked(files: list[Path], monitor: str, mode: str) -> list[Path]:
    """The checkpoints scored on `monitor`, best first (newest first among equals)."""
    scored = [(v, p) for p in files if math.isfinite(v := scores(p).get(monitor, math.nan))]
    scored.sort(key=lambda vp: vp[0] if mode == "min" else -vp[0])
    return [p for _, p in scored]
