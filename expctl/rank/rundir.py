"""The run directory: decided once, created atomically, written by rank 0 only.

Its name comes from ``run.dir`` when set, else from an id every rank knows without talking (the
Slurm job id, or the id a launcher passes down), else from the time plus a random suffix; the
folder is made with ``mkdir`` (atomic), so two runs started in the same second never share one.
An existing run directory is reused (to resume) only when its frozen config matches, and a new
launch continues the run it holds only with checkpoint.resume=auto (restarts within a launch,
elastic or Slurm requeue, always continue it). A completed run that a launch would not train
further keeps its config.

While a launch trains a run it holds the directory (`runlock.RunLock`: flocks on the folder and on
RUN_DIR/.lock, released by the kernel when the holder dies): a second launch on a live run is
refused, naming the holder, before it changes anything, whatever became of the lock file. A
launch refused after it took the lock undoes what it did there (`abandon`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from expctl import importpath
from expctl.atomic import write_atomically
from expctl.config import frozen as config_mod
from expctl.config.schema import SWEEP_DRIVER_KEYS, Config
from expctl.errors import UserError
from expctl.layout import RunDir, SweepDir, checkpoint_scores, checkpoint_step, fresh_names
from expctl.rank.runlock import RunLock
from expctl.rank.runlock import is_locked as is_locked  # read by `expctl status`

# keys that may change between an interrupted run and its continuation
RESUMABLE_CHANGES = (
    "train.max_epochs",
    "train.max_steps",
    "train.log_every",
    "train.gc_every",  # when Python's collector runs: not what is computed
    "train.activation_checkpointing",  # memory against time: the same gradients
    "train.fsdp.reshard_after_forward",
    # how samples are read, not which: the same batches (the corrupt-file error's hint, a
    # decoder within a grey level of another, any number of workers)
    "data.num_workers",
    "data.pin_memory",
    "data.prefetch_factor",
    "data.timeout",
    "data.on_corrupt",
    "data.decode",
    "launcher.",
    "checkpoint.",
    "env.",
    "logger",  # where metrics go besides metrics.jsonl
)


def deterministic_dir(cfg: Config, run_id: str | None) -> Path | None:
    """The run directory every rank can compute alone, or None when one must be invented."""
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().absolute()
    if run_id:
        return Path(cfg.run.root).expanduser().absolute() / f"{_safe(cfg.run.name)}-{_safe(run_id)}"
    return None


def _safe(text: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in str(text)).strip("._")
    return out or "run"


def create(
    cfg: Config,
    run_id: str | None = None,
    restart: bool = False,
    lock: bool = True,
    sweep_trial: bool = False,
) -> tuple[Config, RunLock | None]:
    """Create (or reopen, to resume) the run directory, take its lock, write config.yaml.

    Args:
        restart: this process restarts a launch already under way (elastic restart, Slurm
            requeue), which continues the run whatever checkpoint.resume says.
        lock: take RUN_DIR/.lock (False: a worker whose launching process holds it).
        sweep_trial: the sweep driver makes a trial's directory (inside its sweep's).

    Returns:
        The config with ``run.dir`` set to the absolute path of the directory, and the lock
        (the caller releases it when the launch ends, or at once if it only prepares the run).

    Raises:
        UserError: the directory is in use by a live launch, holds another run's config, holds
            a run that checkpoint.resume=never or PATH would start over, or cannot be created.
    """
    path = deterministic_dir(cfg, run_id)
    root = path.parent if path is not None else Path(cfg.run.root).expanduser().absolute()
    if not sweep_trial:
        _refuse_in_sweep(path, root)
    made = [p for p in (root, *root.parents) if not p.exists()]  # the folders this call makes
    held: RunLock | None = None
    created = False
    try:
        if path is None:
            path = _new_unique(root, _safe(cfg.run.name))
            created = True
        else:
            created = _make(path)
        frozen = cfg.replace("run", dir=str(path))
        if lock:
            held = _lock(path, created)
            held.made_parents = made
        replaced = _write_config(path, frozen, fresh=created, restart=restart)
        if held is not None:
            held.replaced = replaced
    except BaseException:
        if held is not None:
            abandon(held)
        elif created and not lock and path is not None:
            discard_if_unstarted(path, fresh=True)
        # lock and no `held`: another launch won the folder this one made, and holds it
        for folder in made:
            _remove_if_empty(folder)
        raise
    return frozen, held


def _refuse_in_sweep(path: Path | None, root: Path) -> None:
    """A sweep's directory holds its trials, each made by its driver: a run of one's own there
    (or inside a trial's folder) would take the place of a trial the sweep has yet to start,
    which then fails, or show in its table. A trial the sweep started (its trial.json) may be
    rerun or continued by hand; a folder deeper down (`cd SWEEP; expctl run`: SWEEP/runs/...)
    is no trial's.

    Raises:
        UserError: `path` (or a fresh folder under `root`) would lie there.
    """
    root = Path(os.path.normpath(root))
    path = Path(os.path.normpath(path)) if path is not None else None
    if path is not None and _is_sweep(SweepDir(path)):
        raise UserError(
            f"run.dir={path} is the directory of a sweep: it holds the sweep's trials",
            "pick a run.dir outside the sweep; `expctl sweep table` lists its trials",
        )
    sweep = next((p for p in (root, *root.parents) if _is_sweep(SweepDir(p))), None)
    if sweep is None:
        return
    parts = (path if path is not None else root / "_").relative_to(sweep).parts
    if len(parts) == 1 and path is not None and RunDir(path).trial.is_file():
        return  # a trial the sweep started
    if len(parts) > 1 and SweepDir.number_of(parts[0]) is None:
        return
    where = f"run.dir={path}" if path is not None else f"run.root={root}"
    raise UserError(
        f"{where} would put a run in the directory of sweep {sweep}, which holds its trials only",
        "pick a run.dir outside the sweep; to train a trial's config by hand: "
        f"expctl run -C {sweep}/trial_000/config.yaml run.dir=ANOTHER_DIR",
    )


def _is_sweep(d: SweepDir) -> bool:
    return d.spec.is_file() and d.journal.is_file()


def abandon(held: RunLock) -> None:
    """Undo, while still holding it, what the launch holding `held` did to its run directory
    (it trained nothing: a refusal), then release it: config.yaml as it was, no lock file or
    folder of its making."""
    run = RunDir(held.path.parent)
    try:
        if held.replaced is not None:
            with contextlib.suppress(OSError):
                write_atomically(run.config, held.replaced, 0o640)
        discard_if_unstarted(run.path, fresh=held.made_dir, made=held.made_parents)
        if held.made_lock:
            held.path.unlink(missing_ok=True)
        if held.made_dir:
            _remove_if_empty(run.path)
    finally:
        held.release()


def _lock(path: Path, made_dir: bool) -> RunLock:
    try:
        return RunLock(path, made_dir)
    except OSError as e:
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise UserError(
            f"cannot write in run directory {path}: {e.strerror or e}",
            f"free space in {path.parent}, or pick another run.root / run.dir"
            if full
            else f"check {RunDir(path).lock} and the permissions of {path}, or pick another "
            "run.dir",
        ) from None


# what expctl may leave in a run directory before it holds a config (a lock, a Slurm job that
# never started training, a sweep trial's identity): such a folder is still free to use
_BOOKKEEPING = {RunDir.LOCK, RunDir.JOBS, RunDir.TRIAL, RunDir.SLURM, RunDir.IMPORTS}


def _make(path: Path) -> bool:
    try:
        path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        path.mkdir(mode=0o750)
        return True
    except FileExistsError:
        if not path.is_dir():
            raise UserError(
                f"run.dir {path} exists and is not a directory", "pick another run.dir"
            ) from None
        return False
    except OSError as e:
        raise UserError(
            f"cannot create run directory {path}: {e.strerror}",
            "shorten run.name / run.dir: a folder's name holds at most 255 bytes"
            if e.errno == errno.ENAMETOOLONG
            else "check run.root / run.dir",
        ) from None


def _new_unique(root: Path, name: str) -> Path:
    for fresh in fresh_names(name):
        path = root / fresh
        if _make(path):
            return path
    raise UserError(f"could not create a fresh run directory under {root}", "check run.root")


def _write_config(path: Path, cfg: Config, fresh: bool, restart: bool) -> bytes | None:
    """Write config.yaml, or check that the run `path` holds may go on under `cfg`.

    Returns:
        The config.yaml that `cfg` replaced (None: none replaced).
    """
    target = RunDir(path).config
    text = config_mod.to_yaml(cfg)
    replaced = None
    if not fresh and target.exists():
        old = config_mod.load(path)
        diff = changes(cfg) or []  # how a sweep ran a trial is not its config
        blocking = [k for k in diff if not k.startswith(RESUMABLE_CHANGES)]
        if blocking:
            newest = RunDir(path).checkpoint_files()
            raise UserError(
                f"run.dir={path} holds a run with a different config: "
                + _describe(blocking, old.to_dict(), cfg.to_dict()),
                "use a new run.dir"
                + (
                    "; to start from its last checkpoint (weights, optimizer state, step): "
                    f"checkpoint.resume={newest[0]}"
                    if newest
                    else ""
                ),
            )
        resume = cfg.checkpoint.resume
        step = _progress(path)
        if resume != "auto" and not restart and step is not None:
            raise UserError(
                f"run.dir={path} already holds a run (step {step}); "
                f"checkpoint.resume={resume} would overwrite it",
                "use a new run.dir, or checkpoint.resume=auto to continue it",
            )
        if not diff:
            return None
        _refuse_if_completed(path, old, cfg, diff)
        replaced = target.read_bytes()
    elif not fresh and any(p.name not in _BOOKKEEPING for p in path.iterdir()):
        raise UserError(
            f"run.dir {path} is not empty and holds no config.yaml", "pick an empty or new run.dir"
        )
    found = importpath.origins(cfg.imports)  # load_model and -C config.yaml find them anywhere
    if found:
        _write(RunDir(path).imports, json.dumps(found, indent=2) + "\n")
    _write(target, text)
    return replaced


def _refuse_if_completed(path: Path, old: Config, new: Config, diff: list[str]) -> None:
    """A completed run that `new` would not train further keeps its config: a changed value
    would describe training that never happened (a dropped checkpoint.monitor: `expctl eval`
    would score its last checkpoint, not its best).

    Raises:
        UserError: naming the changed keys.
    """
    result = RunDir(path).read_result()
    step, epoch = result.get("step"), result.get("epoch")
    if result.get("status") != "completed" or not isinstance(step, int):
        return
    if not isinstance(epoch, int):
        return
    if step != _progress(path):
        return  # continued since it completed: whatever changed applies from here on
    train_cfg = new.train
    steps_left = train_cfg.max_steps is None or train_cfg.max_steps > step
    done = _epochs_done(path, step, epoch)
    longer = steps_left and (train_cfg.max_epochs is None or train_cfg.max_epochs > done)
    if longer and not result.get("stopped_early"):
        return  # it trains on, under the new values
    raise UserError(
        f"run.dir={path} holds a completed run (step {step}) that this config would not train "
        "further, so its config stays as it is: " + _describe(diff, old.to_dict(), new.to_dict()),
        "drop those values to see its results, or raise train.max_steps / train.max_epochs to "
        "continue it; for a new run, use another run.dir",
    )


def _epochs_done(path: Path, step: int, epoch: int) -> int:
    """The epochs a run completed: its newest checkpoint's record says (result.json counts the
    epoch of its last step from 1: a run stopped inside epoch 2 by max_steps says 2, done 1)."""
    newest = RunDir(path).checkpoint_files()
    if newest:
        try:
            record = json.loads(checkpoint_scores(newest[0]).read_text())
            if record.get("step") == step and isinstance(record.get("epoch"), int):
                return int(record["epoch"])
        except (OSError, ValueError, AttributeError):
            pass
    return epoch


def _write(target: Path, text: str) -> None:
    """Write `target` whole or not at all (a reader never sees half of it)."""
    try:
        write_atomically(target, text, 0o640)
    except OSError as e:
        raise UserError(
            f"cannot write {target}: {e.strerror or e}",
            f"check the free space and permissions of {target.parent}",
        ) from None


def _progress(path: Path) -> int | None:
    """The step the run in `path` reached (newest checkpoint, else last metrics row), or None
    when it holds no run yet (a fresh directory, or one only created for a launch)."""
    newest = RunDir(path).checkpoint_files()
    if newest:
        return checkpoint_step(newest[0])
    if not RunDir(path).metrics.is_file() or not RunDir(path).metrics.stat().st_size:
        return None
    rows = RunDir(path).metric_rows()
    try:
        return int(rows[-1]["step"]) if rows else 0
    except (ValueError, KeyError, TypeError):
        return 0


def _describe(keys: list[str], old: dict[str, Any], new: dict[str, Any], shown: int = 3) -> str:
    """'optim.lr=0.1 there, 0.01 here' for the first `shown` keys, and how many more differ."""
    parts = [f"{k}={_get(old, k)} there, {_get(new, k)} here" for k in keys[:shown]]
    more = f" (and {len(keys) - shown} more)" if len(keys) > shown else ""
    return "; ".join(parts) + more


def _get(tree: dict[str, Any], dotted: str) -> str:
    value: Any = tree
    for part in dotted.split("."):
        value = value.get(part, "unset") if isinstance(value, dict) else "unset"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def changes(cfg: Config) -> list[str] | None:
    """The keys in which `cfg` differs from the config frozen in its run.dir, without those of
    how a sweep ran it (None: no run.dir, or no config there)."""
    path = deterministic_dir(cfg, None)
    if path is None or not RunDir(path).config.is_file():
        return None
    frozen = cfg.replace("run", dir=str(path))
    diff = _differences(config_mod.load(path).to_dict(), frozen.to_dict())
    return [k for k in diff if not k.startswith(SWEEP_DRIVER_KEYS)]


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    flat_a, flat_b = config_mod.flatten(a), config_mod.flatten(b)
    return [k for k in sorted(flat_a.keys() | flat_b.keys()) if flat_a.get(k) != flat_b.get(k)]


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def discard_if_unstarted(path: Path, fresh: bool = False, made: Sequence[Path] = ()) -> None:
    """Remove what a launch that a user error stopped before it saved anything to continue from
    wrote in its run directory: no checkpoint, no result, and no metrics of an earlier launch.
    With `fresh`, this launch made the folder: whatever it holds goes, metrics of this launch
    included, and the folder too, with those of `made` (the folders above it that the launch
    made, deepest first) that are empty. A folder that was there before stays, even empty (the
    user's, or the shell's current directory)."""
    run = RunDir(path)
    if (run.checkpoints.is_dir() and any(run.checkpoints.glob("*.pt"))) or run.result.exists():
        return
    if fresh:
        shutil.rmtree(path, ignore_errors=True)
        for folder in made:
            _remove_if_empty(folder)
        return
    if run.metrics.exists() and run.metrics.stat().st_size > 0:
        return
    for file in (run.config, run.imports, run.trial, run.log, run.metrics, run.csv, run.lock):
        file.unlink(missing_ok=True)
    for file in (run.output, run.provenance, *run.diffs()):
        file.unlink(missing_ok=True)
    for folder in (run.tb, run.path / RunDir.WANDB, run.checkpoints, run.code):
        shutil.rmtree(folder, ignore_errors=True)
