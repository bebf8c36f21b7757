"""The checkpoint format: one file per save, written atomically, checked by SHA-256, loaded safely.

``RUN_DIR/checkpoints/step_000001234.pt`` holds a dict:

    format: 1, step, epoch, batch (micro-batches done in `epoch`), world_size,
    models / optimizers / schedulers: {name: state_dict}, scaler: state_dict | None,
    rng: [per-rank RNG states], val / train: last validation / train metrics,
    metrics_rows: rows of metrics.jsonl written before it (the rest are logged again on resume)

next to ``step_000001234.pt.sha256``. Loading uses ``torch.load(weights_only=True)``: tensors
and plain containers only, never arbitrary pickled objects.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from expctl.errors import CheckpointError
from expctl.layout import RunDir

if TYPE_CHECKING:
    from expctl.build import Parts

FORMAT = 1
log = logging.getLogger("expctl")


def capture(
    parts: Parts, state: dict[str, Any], rng: list[dict[str, Any]], metrics_rows: int
) -> dict[str, Any]:
    """The checkpoint payload of a run at `state` (`TrainState.state_dict()`: step, epoch, batch,
    val, train), with every rank's RNG state and the number of metrics.jsonl rows logged so far."""
    return {
        **state,
        "world_size": len(rng),
        "model_args": parts.model_args,
        "models": {k: m.state_dict() for k, m in parts.models.items()},
        "optimizers": {k: o.state_dict() for k, o in parts.ctx.optimizers.items()},
        "schedulers": {k: s.state_dict() for k, s in parts.schedulers.items()},
        "scaler": parts.ctx.scaler.state_dict() if parts.ctx.scaler is not None else None,
        "rng": rng,
        "metrics_rows": metrics_rows,
    }


def apply(payload: dict[str, Any], parts: Parts, rank: int, world_size: int) -> dict[str, Any]:
    """Load a payload into the built parts and this rank's RNG; return where training stood
    (for `TrainState.load_state_dict`).

    Raises:
        ValueError: the checkpoint's models or optimizers do not match the built ones.
    """
    targets = [
        *((f"model '{n}'", parts.models.get(n), sd) for n, sd in payload["models"].items()),
        *(
            (f"optimizer '{n}'", parts.ctx.optimizers.get(n), sd)
            for n, sd in payload["optimizers"].items()
        ),
        *(
            (f"scheduler '{n}'", parts.schedulers[n], sd)
            for n, sd in (payload.get("schedulers") or {}).items()
            if n in parts.schedulers
        ),
    ]
    if parts.ctx.scaler is not None and payload.get("scaler"):
        targets.append(("grad scaler", parts.ctx.scaler, payload["scaler"]))
    for what, target, sd in targets:
        if target is None:
            raise ValueError(f"its {what} is not part of this config")
        try:
            target.load_state_dict(sd)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            raise ValueError(
                f"its {what} does not match: {' '.join(str(e).split())[:240]}"
            ) from None
    rng = payload.get("rng") or []
    if len(rng) == world_size:
        set_rng_state(rng[rank])
    else:
        log.warning(
            "checkpoint written by %d rank(s), now %d: RNG streams restart from the seed",
            len(rng),
            world_size,
        )
    return {k: payload.get(k) for k in ("step", "epoch", "batch", "val", "train")}


def path_for(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` goes."""
    return RunDir(run_dir).checkpoints / f"step_{step:09d}.pt"


def save(run_dir: Path, payload: dict[str, Any], keep: int) -> Path:
    """Write `payload` atomically (temporary file, fsync, checksum, rename), keep the newest `keep`.

    Raises:
        CheckpointError: the write failed; no partial file is left under a checkpoint name.
    """
    final = path_for(run_dir, int(payload["step"]))
    final.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    digest_file = final.with_name(final.name + ".sha256")
    for stale in final.parent.glob(".step_*.tmp-*"):  # left by a process killed mid-write
        stale.unlink(missing_ok=True)
    try:
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **payload}, f)
            f.flush()
            os.fsync(f.fileno())
        digest = _sha256(tmp)
        _write_atomic(digest_file, f"{digest}  {final.name}\n")
        os.chmod(tmp, 0o640)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except (OSError, RuntimeError) as e:  # torch.save wraps a failed write in a RuntimeError
        cause = e if isinstance(e, OSError) else e.__context__
        if not isinstance(cause, OSError):
            raise
        tmp.unlink(missing_ok=True)
        if not final.exists():
            digest_file.unlink(missing_ok=True)
        raise CheckpointError(
            f"could not write checkpoint {final} ({cause.strerror or cause}); "
            "the previous checkpoint is intact"
        ) from e
    _prune(final.parent, keep)
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _prune(folder: Path, keep: int) -> None:
    for old in list_checkpoints(folder.parent)[keep:]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints of a run, newest first."""
    return RunDir(run_dir).checkpoint_files()


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one checkpoint after checking its SHA-256 (weights_only: no arbitrary unpickling).

    Raises:
        ValueError: the file is corrupt, truncated, or not an expctl checkpoint.
    """
    digest_file = path.with_name(path.name + ".sha256")
    if digest_file.is_file():
        expected = digest_file.read_text().split()[0] if digest_file.read_text().strip() else ""
        if _sha256(path) != expected:
            raise ValueError(f"checksum mismatch for {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        text = " ".join(str(e).split())[:200]  # one line: torch's messages span several
        raise ValueError(f"cannot read {path}: {type(e).__name__}: {text}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an expctl checkpoint of format {FORMAT}")
    return payload


def newest_valid(
    run_dir: Path, map_location: str | torch.device = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that loads, skipping corrupt ones with a warning naming each."""
    for path in list_checkpoints(run_dir):
        try:
            return path, load(path, map_location)
        except ValueError as e:
            log.warning("skipping checkpoint %s: %s", path.name, e)
    return None


# ---------------------------------------------------------------------------------------------
# RNG state, per rank
# ---------------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, CUDA, Python, NumPy) in weights_only-safe types."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (
            kind,
            torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            pos,
            has_gauss,
            cached,
        )
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
