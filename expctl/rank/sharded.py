"""Checkpoints of sharded models (train.strategy=fsdp, hsdp) in torch.distributed.checkpoint's
format (DCP): every rank writes its own shard, any number of ranks reads them back (resharding),
and one process can read the whole model.

``RUN_DIR/checkpoints/step_000001234.dcp/`` is a folder, whole or absent: it is written as a
hidden temporary folder beside it, renamed once every rank's shard, the rest of the payload and
the manifest are on disk (a process killed before leaves only the hidden folder, which the next
save removes). It holds

    .metadata, __RANK_N.distcp   DCP's files: `models` and `optimizers` ({name: state dict},
                                 sharded; parameters by name, so any layout can read them)
    extra.pt                     the rest of checkpoint.py's payload (step, epoch, schedulers,
                                 RNG states, ...), read with torch.load(weights_only=True)

next to ``step_000001234.dcp.sha256``, the manifest (a SHA-256 line per file of the folder, as
`sha256sum -c` reads it in checkpoints/), and ``step_000001234.dcp.json``, the validation
metrics of these weights (as for a .pt checkpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import (
    CheckpointException,
    FileSystemReader,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from expctl.atomic import remove, replace_folder, temporaries, temporary_folder, write_atomically
from expctl.errors import CheckpointError
from expctl.layout import checkpoint_digest, checkpoint_scores

if TYPE_CHECKING:
    from expctl.rank.control import Control

EXTRA = "extra.pt"  # the payload besides the sharded state dicts


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """DCP in one process (one rank, `load_model`) warns that it assumes so: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are split over ranks (FSDP's DTensors)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def state(models: dict[str, nn.Module], optimizers: dict[str, Any]) -> dict[str, Any]:
    """The models' and optimizers' state dicts as DCP saves and loads them: this rank's shards
    (whole tensors for a model that is not split), parameters named as in the model."""
    return {
        "models": {k: get_model_state_dict(m) for k, m in models.items()},
        "optimizers": {k: get_optimizer_state_dict(models[k], o) for k, o in optimizers.items()},
    }


def write(final: Path, payload: dict[str, Any], scores: str, control: Control) -> None:
    """Write `payload` (its `models` and `optimizers` from `state`) as the checkpoint folder
    `final`, on every rank together; `scores` (JSON) goes beside it.

    Raises:
        CheckpointError: a rank could not write; no folder has the checkpoint's name (raised on
            every rank, so that none waits for the others).
    """
    main = control.env.is_main
    failed: BaseException | None = None
    try:
        made = _fresh(final) if main else ""
    except OSError as e:
        made, failed = "", e
    tmp = control.broadcast(made)
    digests: list[dict[str, str]] = []
    if tmp:
        try:
            shards = {"models": payload["models"], "optimizers": payload["optimizers"]}
            with _alone():
                dcp.save(
                    shards,
                    checkpoint_id=tmp,
                    process_group=control.group,
                    no_dist=not control.group,
                )
            digests = control.gather(_digests(Path(tmp), control.env.rank, control.env.world_size))
        except (Exception, CheckpointException) as e:  # every rank's failure, on all of them
            failed = e
    if main and tmp and failed is None:
        try:
            extra = {k: v for k, v in payload.items() if k not in ("models", "optimizers")}
            with open(Path(tmp) / EXTRA, "xb") as f:
                torch.save(extra, f)
                f.flush()
                os.fsync(f.fileno())
            write_atomically(checkpoint_scores(final), scores)
            _seal(Path(tmp), final, {k: v for d in digests for k, v in d.items()})
        except (OSError, RuntimeError) as e:  # torch.save wraps a failed write in a RuntimeError
            failed = e
    why = control.broadcast(None if failed is None else _why(failed))
    if why is not None:
        if main and tmp:
            remove(Path(tmp))
        raise CheckpointError(
            f"could not write checkpoint {final} ({why}); the previous checkpoint is intact"
        ) from failed


def _fresh(final: Path) -> str:
    """A new hidden folder beside `final` for the shards (those a killed write left, gone)."""
    final.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    for stale in temporaries(final.parent, final.name):
        remove(stale)
    return str(temporary_folder(final))


def _digests(folder: Path, rank: int, world_size: int) -> dict[str, str]:
    """The SHA-256 of this rank's share of the folder's files (every rank hashes some)."""
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {p.name: file_sha256(p) for p in files[rank::world_size]}


def _seal(tmp: Path, final: Path, digests: dict[str, str]) -> None:
    """The manifest, then the folder under its name, each on disk before the next: a folder
    under a checkpoint's name is always whole, with its manifest beside it (one saved again at
    its step, restored where it ended, is set aside first)."""
    digests[EXTRA] = file_sha256(tmp / EXTRA)
    manifest = "".join(f"{h}  {final.name}/{n}\n" for n, h in sorted(digests.items()))
    replace_folder(tmp, final, lambda: write_atomically(checkpoint_digest(final), manifest))


def _why(e: BaseException) -> str:
    """One line for a failure: the OS's words for an OSError, the first failing rank's error
    for DCP's (whose text is every rank's traceback)."""
    if isinstance(e, CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    cause = e if isinstance(e, OSError) else e.__context__ or e
    text = getattr(cause, "strerror", None) or " ".join(str(cause).split())[:200]
    return str(text)


def problem(folder: Path) -> str | None:
    """Why the manifest beside checkpoint folder `folder` does not prove it whole and intact
    (None: it does; a folder without one, like a .pt without its .sha256, is read unchecked)."""
    digest_file = checkpoint_digest(folder)
    if not folder.is_dir():
        return "not a checkpoint folder"
    try:
        lines = digest_file.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"cannot read {digest_file.name} ({e.strerror or e})"
    for line in lines:
        expected, _, name = line.partition("  ")
        path = folder.parent / name
        try:
            if file_sha256(path) != expected:
                return f"checksum mismatch for {path}"
        except OSError as e:
            return f"cannot read {path} ({e.strerror or e})"
    return None if lines else f"{digest_file.name} lists no file"


def is_folder(path: Path) -> bool:
    """Whether `path` is a checkpoint folder of shards (rather than a run directory)."""
    return path.is_dir() and path.suffix == ".dcp"


def read(folder: Path, map_location: Any, weights: bool) -> Any:
    """A checkpoint folder's payload, its manifest checked: the rest of the payload (weights_only:
    tensors and plain containers), `sharded_from` naming the folder, and with `weights` the
    models read whole (`read_models`).

    Raises:
        ValueError: the folder fails its manifest, or cannot be read.
    """
    why = problem(folder)
    if why is not None:
        raise ValueError(why)
    try:
        payload = torch.load(folder / EXTRA, map_location=map_location, weights_only=True)
        if isinstance(payload, dict):
            payload["sharded_from"] = str(folder)
            if weights:
                payload["models"] = read_models(folder)
    except (Exception, CheckpointException) as e:
        raise ValueError(f"cannot read {folder}: {type(e).__name__}: {_why(e)}") from None
    return payload


def read_models(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every model's whole state dict, read in this process alone (no optimizer state): what
    `load_model`, `expctl eval` and checkpoint.init use."""
    meta = FileSystemReader(folder).read_metadata()
    wanted: dict[str, Any] = {
        key: torch.empty(m.size, dtype=m.properties.dtype)
        for key, m in meta.state_dict_metadata.items()
        if key.startswith("models.") and isinstance(m, TensorStorageMetadata)
    }
    with _alone():
        dcp.load(wanted, checkpoint_id=folder, no_dist=True)
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in wanted.items():
        _, name, param = paths.get(key) or key.split(".", 2)  # ("models", NAME, "0.weight")
        out.setdefault(str(name), {})[str(param)] = tensor
    return out


def load_into(folder: Path, models: dict[str, nn.Module], optimizers: dict[str, Any]) -> None:
    """Load a checkpoint folder's models and optimizers into these (on every rank together,
    each reading its own shard, whatever the number of ranks that wrote them).

    Raises:
        ValueError: the checkpoint holds other models or optimizers (a name or a shape).
    """
    held = state(models, optimizers)
    try:
        with _alone():
            dcp.load(held, checkpoint_id=folder, no_dist=not dist.is_initialized())
    except (Exception, CheckpointException) as e:  # DCP's: every rank's failure
        raise ValueError(f"its models do not match: {_why(e)}") from None
    for name, m in models.items():
        set_model_state_dict(m, held["models"][name])
    for name, o in optimizers.items():
        set_optimizer_state_dict(models[name], o, held["optimizers"][name])


def put_whole(model: nn.Module, weights: dict[str, Any]) -> None:
    """Load whole tensors (a state dict of one process) into a model, sharded or not."""
    if is_sharded(model):
        options = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, weights, options=options)
    else:
        model.load_state_dict(weights, strict=False)
