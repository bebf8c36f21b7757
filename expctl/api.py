"""The Python API: train from a config inside a larger program, load what a run trained, and
score it again on any split or data."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from expctl import registry
from expctl.config import compose
from expctl.config import frozen as config_mod
from expctl.config.values import check_name
from expctl.errors import UserError, did_you_mean
from expctl.jobs import launch
from expctl.jobs.launch import Result
from expctl.layout import RunDir
from expctl.rank import checkpoint as ckpt
from expctl.rank import strategy
from expctl.rank.evaluate import Evaluation
from expctl.rank.provenance import Launch


def run(config: str | None = None, overrides: Sequence[str] = (), wait: bool = True) -> Result:
    """Compose `config` (a .yml/.yaml path, or None for the built-in default) with Hydra-style
    `overrides`, validate it, train with its launcher and return the result (launcher=slurm:
    once submitted, unless `wait`).

    Raises:
        UserError: a bad config, name, value or environment.
    """
    overrides = override_list(overrides)
    with caller_state_kept():
        notes: list[str] = []
        cfg = compose.compose(config, overrides, notes=notes)
        if cfg.sweep.params:
            notes.append(
                f"sweep.params ({', '.join(cfg.sweep.params)}) is the search space of a sweep: "
                "this run trains the config as it is (`expctl run -m` sweeps it)"
            )
        for note in notes:
            print(f"expctl: note: {note}", file=sys.stderr, flush=True)
        return launch.launch(cfg, wait=wait, origin=Launch.here(config, overrides))


def override_list(overrides: Sequence[str]) -> list[str]:
    """`overrides` as a list; one string is refused, not split (where its spaces separate
    overrides and where they are quoted values would be a guess)."""
    if isinstance(overrides, str):
        raise UserError(
            f"overrides={overrides!r} is one string, not a list of overrides",
            f"pass a list, one override per item: overrides={overrides.split()!r}",
        )
    items = list(overrides) if isinstance(overrides, Iterable) else [overrides]
    bad = [o for o in items if not isinstance(o, str)]
    if bad:
        raise UserError(
            f"overrides: {bad[0]!r} is not a string",
            "pass a list of strings such as ['optim.lr=0.1']",
        )
    return items


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


@contextlib.contextmanager
def caller_state_kept() -> Iterator[None]:
    """A run inside a larger program leaves it as it found it, returned or raised: its signal
    handlers (torch's elastic agent installs its own), environment variables (`env:`),
    ``sys.path``, torch's global flags and RNG streams, and the ``expctl`` logger."""
    main = threading.current_thread() is threading.main_thread()
    handlers = {
        sig: signal.getsignal(sig) for sig in (getattr(signal, n) for n in _SIGNALS) if main
    }
    environ, path = dict(os.environ), list(sys.path)
    backends = torch.backends
    flags = (
        torch.get_float32_matmul_precision(),
        backends.cuda.matmul.allow_tf32,
        backends.cudnn.allow_tf32,
        backends.cudnn.benchmark,
        torch.get_num_threads(),
    )
    rng = (torch.get_rng_state(), random.getstate())
    logger = logging.getLogger("expctl")
    logs = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
        torch.set_float32_matmul_precision(flags[0])
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32 = flags[1], flags[2]
        backends.cudnn.benchmark = flags[3]
        torch.set_num_threads(flags[4])
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        for h in logger.handlers:
            if h not in logs[0]:
                h.close()
        logger.handlers[:] = logs[0]
        logger.setLevel(logs[1])
        logger.propagate = logs[2]


def load_model(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    device: str = "cpu",
    which: str | None = None,
) -> Any:
    """The trained model of a run (a dict of models for multi-model runs), in eval mode.

    Args:
        run_dir: the run directory printed at the start of the run.
        checkpoint: a specific checkpoint file (the same as `which=PATH`).
        device: where to put the weights.
        which: ``best`` (by the run's checkpoint.monitor), ``last`` (the newest valid one) or a
            checkpoint's path; default: best when the run monitored a metric, else last.

    Raises:
        UserError: no run directory or no such loadable checkpoint.
    """
    if checkpoint is not None and which is not None:
        raise UserError(
            "load_model: pass checkpoint= or which=, not both", "which=PATH is the same"
        )
    run_dir = Path(run_dir)
    cfg = config_mod.load(run_dir)
    registry.import_user_modules(cfg.imports, RunDir(run_dir).read_imports())
    _, payload = ckpt.pick(run_dir, str(checkpoint) if checkpoint is not None else which, device)
    built = registry.get("models", cfg.model.name).factory(**payload["model_args"])
    models = built if isinstance(built, dict) else {"model": built}
    for name, m in models.items():
        strategy.materialise(cfg.model.name, name, m, device, cfg.train.seed)  # meta: made here
        m.load_state_dict(payload["models"][name])
        m.to(device).eval()
    return models["model"] if list(models) == ["model"] else models


SPLITS = ("val", "test", "train")


def evaluate(
    run_dir: str | Path,
    split: str = "val",
    which: str | None = None,
    overrides: Sequence[str] = (),
    name: str | None = None,
) -> dict[str, Any]:
    """Score a run's checkpoint on a split of its data (or of other data: ``data.*``
    overrides) with its launcher's ranks (``launcher=local launcher.nproc=2`` overrides it);
    writes RUN_DIR/eval/NAME.json and returns that record.

    Args:
        split: val, test or train.
        which: best, last or a checkpoint's path, as for `load_model`.
        overrides: Hydra-style overrides of the run's frozen config.
        name: the result's name; default ``SPLIT-CHECKPOINT`` (plus a digest of the overrides).

    Raises:
        UserError: not a run, no such checkpoint or split, a bad override.
    """
    overrides = override_list(overrides)
    run = RunDir(Path(run_dir).expanduser().absolute())
    if not run.is_run():
        raise UserError(
            f"{run_dir}: not a run directory (no {RunDir.CONFIG})",
            "pass the folder printed at the start of a run",
        )
    if split not in SPLITS:
        raise UserError(
            f"split '{split}' is not one of: {', '.join(SPLITS)}.{did_you_mean(split, SPLITS)}",
            "use --split val, test or train",
        )
    with caller_state_kept():
        notes: list[str] = []
        cfg = compose.compose(str(run.config), overrides, notes=notes)
        for note in notes:
            print(f"expctl: note: {note}", file=sys.stderr, flush=True)
        path, payload = ckpt.pick(run.path, which)
        digest = hashlib.sha256("\0".join(overrides).encode()).hexdigest()[:6]
        name = name or f"{split}-{path.stem}" + (f"-{digest}" if overrides else "")
        check_name("--name", name)
        ev = Evaluation(str(path.absolute()), int(payload["step"]), split, name, list(overrides))
        return launch.launch(cfg.replace("run", dir=str(run.path)), evaluation=ev).metrics
