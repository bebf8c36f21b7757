"""The Python API: train from a config inside a larger program, and load what a run trained."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from expctl import compose, launch, registry
from expctl import config as config_mod
from expctl.errors import UserError
from expctl.launch import Result
from expctl.layout import RunDir


def run(config: str | None = None, overrides: Sequence[str] = (), wait: bool = True) -> Result:
    """Compose `config` (a .yml/.yaml path, or None for the built-in default) with Hydra-style
    `overrides`, validate it, train with its launcher and return the result (launcher=slurm:
    once submitted, unless `wait`).

    Raises:
        UserError: a bad config, name, value or environment.
    """
    with caller_state_kept():
        notes: list[str] = []
        cfg = compose.compose(config, overrides, notes=notes)
        for note in notes:
            print(f"expctl: note: {note}", file=sys.stderr, flush=True)
        return launch.launch(cfg, wait=wait)


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


@contextlib.contextmanager
def caller_state_kept() -> Iterator[None]:
    """A run inside a larger program leaves it as it found it, returned or raised: its signal
    handlers (torch's elastic agent installs its own), environment variables (`env:`),
    ``sys.path``, torch's global flags and RNG streams, and the ``expctl`` logger."""
    import torch  # lazy: loaded by the launch anyway, never by `import expctl`

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
    run_dir: str | Path, checkpoint: str | Path | None = None, device: str = "cpu"
) -> Any:
    """The trained model of a run (a dict of models for multi-model runs), in eval mode.

    Args:
        run_dir: the run directory printed at the start of the run.
        checkpoint: a specific checkpoint file; default the newest valid one.
        device: where to put the weights.

    Raises:
        UserError: no run directory or no loadable checkpoint.
    """
    from expctl import checkpoint as ckpt  # lazy: torch loads only when a model does

    run_dir = Path(run_dir)
    cfg = config_mod.load(run_dir)
    registry.import_user_modules(cfg.imports, RunDir(run_dir).read_imports())
    if checkpoint is not None:
        path, payload = Path(checkpoint), ckpt.load(Path(checkpoint), device)
    else:
        found = ckpt.newest_valid(run_dir, device)
        if found is None:
            raise UserError(
                f"{run_dir}: no loadable checkpoint", "train the run first, or pass checkpoint=PATH"
            )
        path, payload = found
    built = registry.get("models", cfg.model.name).factory(**payload["model_args"])
    models = built if isinstance(built, dict) else {"model": built}
    for name, m in models.items():
        m.load_state_dict(payload["models"][name])
        m.to(device).eval()
    return models["model"] if list(models) == ["model"] else models
