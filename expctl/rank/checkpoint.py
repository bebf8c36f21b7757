"""The checkpoint format: one file per save, written atomically, checked by SHA-256, loaded safely.

``RUN_DIR/checkpoints/step_000001234.pt`` holds a dict:

    format: 1, step, epoch, batch (micro-batches done in `epoch`), world_size,
    models / optimizers / schedulers: {name: state_dict}, scaler: state_dict | None,
    rng: [per-rank RNG states], val / train: last validation / train metrics,
    early_best / early_stall: early stopping's best value and validations without improvement,
    train_s: training time of all attempts so far, sched_length: the run's length the schedule
    was built for (null: it does not depend on it),
    metrics_rows: rows of metrics.jsonl written before it (the rest are logged again on resume),
    window: [per-rank sums of the train metrics since the last train row, and their count]

next to ``step_000001234.pt.sha256`` and ``step_000001234.pt.json``: ``{"step", "epoch",
"val"}``, the validation metrics of exactly these weights (``{}`` when no validation ran at
that step), which rank checkpoints by ``checkpoint.monitor``. Loading uses
``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary pickled
objects. A sharded model's checkpoint (train.strategy=fsdp, hsdp) is a folder of the same
payload, ``step_000001234.dcp/``: its format is in sharded.py; picking and loading go through
here for both (listing and keeping: retention.py).
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from expctl.atomic import atomic_file, deferred_interrupt, fsync_dir, remove, write_atomically
from expctl.config import frozen as config
from expctl.config.schema import CheckpointConfig
from expctl.errors import CheckpointError, UserError
from expctl.layout import RunDir, checkpoint_digest, checkpoint_set
from expctl.rank import sharded
from expctl.rank.retention import list_checkpoints, prune, ranked, unverified

if TYPE_CHECKING:
    from expctl.rank.build import Parts
    from expctl.rank.control import Control

FORMAT = 1
log = logging.getLogger("expctl")


def capture(
    parts: Parts, state: dict[str, Any], rng: list[dict[str, Any]], metrics_rows: int
) -> dict[str, Any]:
    """The checkpoint payload of a run at `state` (`TrainState.state_dict()`: step, epoch, batch,
    val, train), with every rank's RNG state and the number of metrics.jsonl rows logged so far
    (`parts.sharded`: this rank's shards of the models and optimizers)."""
    if parts.sharded:  # marked as such: the .pt payload stays as it was
        held = {**sharded.state(parts.models, parts.ctx.optimizers), "sharded": True}
    else:
        held = {
            "models": {k: m.state_dict() for k, m in parts.models.items()},
            "optimizers": {k: o.state_dict() for k, o in parts.ctx.optimizers.items()},
        }
    return {
        **state,
        "world_size": len(rng),
        "model_args": parts.model_args,
        "data": parts.trained_on(),
        **held,
        "schedulers": {k: s.state_dict() for k, s in parts.schedulers.items()},
        "scaler": parts.ctx.scaler.state_dict() if parts.ctx.scaler is not None else None,
        "rng": rng,
        "metrics_rows": metrics_rows,
        "sched_length": parts.sched_length,
    }


def apply(payload: dict[str, Any], parts: Parts, rank: int, world_size: int) -> dict[str, Any]:
    """Load a payload into the built parts and this rank's RNG; return where training stood
    (for `TrainState.load_state_dict`: the payload without its state dicts).

    Raises:
        ValueError: the checkpoint's models or optimizers do not match the built ones.
    """
    shards = payload.get("sharded_from")
    if shards is not None:  # every rank reads its own part, whoever wrote them
        sharded.load_into(Path(shards), parts.models, parts.ctx.optimizers)
    elif parts.sharded and world_size > 1:
        raise ValueError(
            "it holds whole models (train.strategy=ddp), not shards; checkpoint.init=PATH "
            "starts a sharded run from its weights"
        )
    whole = {"models": {}, "optimizers": {}} if shards is not None else payload
    targets = [
        *((f"model '{n}'", parts.models.get(n), sd) for n, sd in whole["models"].items()),
        *(
            (f"optimizer '{n}'", parts.ctx.optimizers.get(n), sd)
            for n, sd in whole["optimizers"].items()
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
    elif rank == 0:  # said once, not by every rank
        within = int(payload.get("batch") or 0)
        log.warning(
            "checkpoint written by %d rank(s), now %d: RNG streams restart from the seed%s",
            len(rng),
            world_size,
            f"; the rest of epoch {int(payload.get('epoch') or 0) + 1} is dealt to {world_size} "
            f"rank(s) afresh, past the first {within} batch(es) of each: some of its samples may "
            "be seen twice or not at all (the next epochs are whole)"
            if within
            else "",
        )
    heavy = ("models", "optimizers", "schedulers", "scaler", "rng", "sharded_from")
    return {k: v for k, v in payload.items() if k not in heavy}


def path_for(run_dir: Path, step: int, shards: bool = False) -> Path:
    """Where the checkpoint of `step` goes (`shards`: the folder of a sharded model's)."""
    return RunDir(run_dir).checkpoint(step, shards)


def save(
    run_dir: Path,
    payload: dict[str, Any],
    ckpt_cfg: CheckpointConfig,
    scores: dict[str, float],
    control: Control | None = None,
) -> Path | None:
    """Write `payload` atomically (temporary file, fsync, checksum, rename) with `scores`, the
    validation metrics of these weights ({} if none); keep the newest `ckpt_cfg.keep`, or with
    `ckpt_cfg.monitor` the best `ckpt_cfg.keep` by it plus the newest. With `control`, every
    rank calls it: rank 0 writes a whole model's payload, every rank its shard of a sharded one.

    Raises:
        CheckpointError: the write failed; no partial file is left under a checkpoint name.
    """
    if payload.get("sharded"):
        assert control is not None, "every rank writes its shard"
        final = path_for(run_dir, int(payload["step"]), shards=True)
        record = {"step": payload["step"], "epoch": payload["epoch"], "val": scores}
        with deferred_interrupt():  # as below
            sharded.write(final, {"format": FORMAT, **payload}, json.dumps(record) + "\n", control)
        if control.env.is_main:
            prune(run_dir, ckpt_cfg)
        return final
    if control is not None and not control.env.is_main:
        return None
    final = path_for(run_dir, int(payload["step"]))
    final.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    _, digest_file, scores_file = checkpoint_set(final)
    existed = final.exists()
    for stale in RunDir(run_dir).checkpoint_temporaries():
        remove(stale)
    # a Ctrl-C meanwhile is raised once the files are whole: inside torch.save it breaks the zip
    # writer, whose RuntimeError would replace the KeyboardInterrupt
    with deferred_interrupt():
        try:
            with atomic_file(final, 0o640) as f:
                torch.save({"format": FORMAT, **payload}, f)
                f.flush()
                digest = f"{_sha256(Path(f.name))}  {final.name}\n"
                if existed:  # saved again (restored where it ended): no old checksum stays
                    digest_file.unlink(missing_ok=True)
                else:
                    write_atomically(digest_file, digest)
                record = {"step": payload["step"], "epoch": payload["epoch"], "val": scores}
                write_atomically(scores_file, json.dumps(record) + "\n")
            if existed:
                write_atomically(digest_file, digest)
            fsync_dir(final.parent)
        except (OSError, RuntimeError) as e:  # torch.save wraps a failed write in a RuntimeError
            cause = e if isinstance(e, OSError) else e.__context__
            if not isinstance(cause, OSError):
                raise
            if not existed:  # none of this step's files stays
                for file in (final, digest_file, scores_file):
                    file.unlink(missing_ok=True)
            raise CheckpointError(
                f"could not write checkpoint {final} ({cause.strerror or cause}); "
                "the previous checkpoint is intact"
            ) from e
    prune(run_dir, ckpt_cfg)
    return final


_sha256 = sharded.file_sha256


def pick(
    run_dir: Path, which: str | None = None, map_location: str | torch.device = "cpu"
) -> tuple[Path, dict[str, Any]]:
    """A run's checkpoint, loaded: `best` (by the run's checkpoint.monitor), `last` (the newest
    that loads), or a checkpoint file's path; None: best when the run monitors a metric, else last.

    Raises:
        UserError: not a run, no such checkpoint, or a best without a monitor.
    """
    if which not in (None, "best", "last"):
        try:
            return Path(which), load(Path(which), map_location)
        except (OSError, ValueError) as e:
            raise UserError(
                f"checkpoint {which}: {e}", "pass best, last or the path of a .pt checkpoint"
            ) from None
    ckpt_cfg = config.load(run_dir).checkpoint
    which = which or ("best" if ckpt_cfg.monitor else "last")
    files = list_checkpoints(run_dir)
    if which == "best":
        if ckpt_cfg.monitor is None:
            raise UserError(
                f"{run_dir} was trained without checkpoint.monitor: it has no best checkpoint",
                "use which=last (its newest), or train with checkpoint.monitor=val/acc",
            )
        files = ranked(files, ckpt_cfg.monitor, ckpt_cfg.mode)
    found = _first_valid(files, map_location)
    if found is None:
        scored = f" scored on {ckpt_cfg.monitor}" if which == "best" else ""
        raise UserError(
            f"{run_dir}: no loadable checkpoint{scored}",
            "train the run first, or pass the path of a checkpoint",
        )
    return found


def load(
    path: Path, map_location: str | torch.device = "cpu", weights: bool = True
) -> dict[str, Any]:
    """Load one checkpoint after checking its SHA-256 (weights_only: no arbitrary unpickling).
    A folder of shards: without `weights`, its models and optimizers stay on disk for `apply`
    to read in shards (`sharded_from`); with them, the models are read whole in this process.

    Raises:
        ValueError: the file is corrupt, truncated, or not an expctl checkpoint.
    """
    if sharded.is_folder(path):
        payload = sharded.read(path, map_location, weights)
    else:
        payload = read_verified(path, map_location)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not an expctl checkpoint of format {FORMAT}")
    return payload


def read_verified(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """A torch file's contents after checking the SHA-256 beside it, if any (weights_only)."""
    digest_file = checkpoint_digest(path)
    if digest_file.is_file():
        try:
            expected = digest_file.read_text(errors="replace").split()[:1]
            matches = expected == [_sha256(path)]
        except OSError as e:  # a folder in its place, a read error
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
        if not matches:
            raise ValueError(f"checksum mismatch for {path}")
    try:
        with warnings.catch_warnings():  # torch's note on another pickle protocol: see the error
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:  # not its advice to load with weights_only=False
        if not zipfile.is_zipfile(path):
            raise ValueError(f"cannot read {path}: not a torch.save file of tensors") from None
        text = " ".join(str(e).split()).split("WeightsUnpickler error:", 1)[-1]
        why = text.split(". ")[0].split(" Check the documentation")[0].strip()[:200]
        raise ValueError(
            f"cannot read {path}: it holds objects other than tensors and plain containers ({why})"
        ) from None
    except Exception as e:
        text = " ".join(str(e).split())[:200]  # one line: torch's messages span several
        raise ValueError(f"cannot read {path}: {type(e).__name__}: {text}") from None
    return payload


def resume_point(
    run_dir: Path, map_location: str | torch.device = "cpu"
) -> tuple[Path, dict[str, Any]] | None:
    """The run's newest checkpoint, loaded, where it continues (None: it has none yet).

    Raises:
        UserError: the newest checkpoint does not load (damaged, or its .sha256 edited): the
            run neither starts over nor falls back to an older one on its own; the error says
            which older one is intact.
    """
    files = list_checkpoints(run_dir)
    if not files:
        return None
    try:
        return files[0], load(files[0], map_location, weights=False)
    except ValueError as e:
        problem = e
    intact = next((p for p in files[1:] if unverified(p) is None), None)
    raise UserError(
        f"run.dir={run_dir}: its newest checkpoint does not load ({problem}); the run is not "
        "started over",
        f"if it is damaged, move {files[0]}* elsewhere to continue from {intact.name}, or start "
        "a new run in another run.dir"
        if intact is not None
        else "restore its checkpoints from a copy, or start a new run in another run.dir (no "
        "older checkpoint of it is intact)",
    )


def _first_valid(
    paths: list[Path], map_location: str | torch.device
) -> tuple[Path, dict[str, Any]] | None:
    for path in paths:
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
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = (
        kind,
        torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        pos,
        has_gauss,
        cached,
    )
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
