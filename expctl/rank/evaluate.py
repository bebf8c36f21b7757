"""`expctl eval` on every rank: score a run's checkpoint with the same ranks as its training
(`evaluate_checkpoint`, told what by an `Evaluation`); rank 0 writes RUN_DIR/eval/NAME.json.
`entry.py` prepares the rank and its process group as for training.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from expctl.config.frozen import redacted
from expctl.config.schema import Config
from expctl.dist import DistEnv
from expctl.errors import UserError
from expctl.layout import RunDir
from expctl.rank.build import build
from expctl.rank.entry import prepare, process_group
from expctl.rank.metrics import score_split
from expctl.rank.report import setup_logging, write_json
from expctl.rank.restore import check_data, put_weights, weights_and_data


@dataclass(frozen=True)
class Evaluation:
    """What `expctl eval` asks of every rank: score the weights of `checkpoint` (of `step`) on
    `split` and write RUN_DIR/eval/NAME.json; `overrides` are recorded there."""

    checkpoint: str
    step: int
    split: str = "val"
    name: str = "val"
    overrides: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Evaluation:
        return cls(**json.loads(text))


def _check_writable(folder: Path) -> None:
    """Before scoring: the folder the score goes to (or its nearest existing parent) can be
    written, so that a read-only run directory is said first, not after the work.

    Raises:
        UserError: it cannot.
    """
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise UserError(
            f"expctl eval writes its score into {folder}, but "
            f"{'it' if existing == folder else existing} is not writable "
            "(a read-only file system, or permissions)",
            "evaluate a writable copy of the run (cp -r RUN COPY, then expctl eval COPY)",
        )


def evaluate_checkpoint(cfg: Config, env: DistEnv, ev: Evaluation) -> tuple[Path, dict[str, Any]]:
    """Score a checkpoint on this rank (metrics reduced exactly over ranks); rank 0 writes
    RUN_DIR/eval/NAME.json. Returns the run directory and that record.

    Raises:
        UserError: the weights do not fit the config, or the data has no such split.
    """
    run_dir = Path(str(cfg.run.dir))
    if env.is_main:
        _check_writable(RunDir(run_dir).eval_result(ev.name).parent)
    device = prepare(cfg, env)
    with process_group(cfg, env, device):
        setup_logging(None, env.is_main, env.rank)
        with redacted(cfg.to_dict(resolved=True), cfg.interpolations):
            parts = build(cfg, env, device, training=False)
        with contextlib.closing(parts):
            path = Path(ev.checkpoint)
            weights, data = weights_and_data(path, [*parts.models])
            check_data(data, parts, path, resume=False)
            try:
                put_weights(parts.models, weights, True)
            except ValueError as e:
                raise UserError(
                    f"{path} does not fit this config's models: {e}",
                    "evaluate with the run's own model settings (no model.* overrides) on data "
                    "of its shape: as many classes and channels as it trained on",
                ) from None
            metrics = score_split(parts, env, ev.split)
    if not metrics:
        raise UserError(
            f"data '{cfg.data.name}' has no {ev.split} split to score (or train.step has no "
            "val_step)",
            "pick another split: --split "
            + " or ".join(s for s in ("val", "test", "train") if s != ev.split),
        )
    record = {**metrics, **asdict(ev), "data": cfg.data.name}
    if env.is_main:
        write_json(RunDir(run_dir).eval_result(ev.name), record)
    return run_dir, record
