"""Loggers: where rank 0's metrics go besides metrics.jsonl, which is always written and stays
the source of truth.

A run picks any number of them: ``logger=[tensorboard,csv]`` on the command line, ``logger:
[csv]`` or ``logger: {mlflow: {experiment: mine}}`` in a file; ``logger.mlflow.KEY=VALUE`` sets
one's arguments. Each is registered (kind ``loggers``) and its signature is its config, as for
models; `run_dir` and `start_step` (where training continues from) are passed by expctl to those
that ask for them. Yours, in a module listed under ``imports:``:

    from expctl import register
    from expctl.builtin.loggers import Logger

    @register("loggers", "printer")
    class Printer(Logger):
        def __init__(self, run_dir: Path, every: int = 1) -> None: ...
        def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

Only rank 0 builds and calls them, from the training thread, at the points where the Reporter
already holds the metrics on the host (every `train.log_every` steps, each validation, the test,
the end): a logger never adds a host sync to a step.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from expctl.atomic import write_atomically
from expctl.errors import UserError
from expctl.layout import RunDir
from expctl.registry import get, register

STATUSES = ("completed", "stopped", "preempted", "interrupted", "failed")


class Logger:
    """A logger's three calls, each a no-op here: override those you need."""

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Once, before training: the run's config as dotted keys (``optim.lr``) with int,
        float, str or bool values (lists and null as JSON text); ``${oc.env:...}`` unresolved."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """One event at optimizer step `step`: ``epoch`` (the event's epoch, counted from 1)
        and the metrics, reduced across ranks (``train/loss``, ``lr``, ``val/acc``, ``test/acc``,
        ...). The last event adds the final metrics of result.json that no event held yet
        (``time/train_s``)."""

    def close(self, status: str) -> None:
        """Once, at the end: `status` is one of `STATUSES`; ``preempted``: the run continues
        later, from its checkpoint."""


def open_all(chosen: Mapping[str, Mapping[str, Any]], run_dir: Path, start_step: int) -> list[Any]:
    """Build the chosen loggers (name -> arguments); one that fails closes those built before."""
    passed = {"run_dir": Path(run_dir), "start_step": start_step}
    built: list[Any] = []
    try:
        for name, args in chosen.items():
            entry = get("loggers", name)
            built.append(entry.factory(**{k: passed[k] for k in entry.runtime}, **args))
    except BaseException:
        for logger in built:
            logger.close("failed")
        raise
    return built


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys; values other than int, float, str, bool as JSON text."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (bool, int, float, str)):
            out[f"{prefix}{key}"] = value
        else:
            out[f"{prefix}{key}"] = json.dumps(value, default=str)
    return out


def _requires(module: str, logger: str) -> Callable[..., None]:
    """A pre-flight check (run when the config is validated, before a run directory exists):
    the logger's package is installed."""

    def check(**_: Any) -> None:
        if importlib.util.find_spec(module) is None:
            raise UserError(
                f"logger {logger} needs the '{module}' package, which is not installed",
                f"pip install 'expctl[{logger}]', or leave {logger} out of logger=[...]",
            )

    return check


@register("loggers", "tensorboard", check=_requires("tensorboard", "tensorboard"))
class TensorBoard(Logger):
    """TensorBoard events in RUN_DIR/tb; at the end, the config and final metrics as hparams.

    The scalars are the events' metrics; the hparams (the HPARAMS tab) are the flattened config
    with the newest value of every metric."""

    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        # optional (expctl[tensorboard]), and torch off `status`, `list` (report imports this):
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

        # a resumed run hides what an earlier attempt logged after its checkpoint
        purge = start_step + 1 if start_step else None
        self.writer = SummaryWriter(str(RunDir(run_dir).tb), purge_step=purge)
        _quiet_writer_thread()
        self.params: dict[str, Any] = {}
        self.last: dict[str, float] = {}

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.params = params

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.last.update(metrics)

    def close(self, status: str) -> None:
        from torch.utils.tensorboard.summary import hparams  # noqa: PLC0415 - as in __init__

        events = self.writer.file_writer  # the run's own event file (not add_hparams' subfolder)
        if self.params and events is not None:
            final = {k: v for k, v in self.last.items() if k != "epoch"}
            for summary in hparams(self.params, final):
                events.add_summary(summary)
        self.writer.close()


def _quiet_writer_thread() -> None:
    """TensorBoard writes events from a thread, which prints its traceback when the disk is full
    (then dies): the training thread's next write raises the same OSError, which expctl reports
    in one line. Other threads' exceptions are printed as before."""
    previous = threading.excepthook
    if getattr(previous, "_expctl", False):
        return

    def hook(args: Any) -> None:
        writer = type(args.thread).__name__ == "_AsyncWriterThread"
        if not (writer and isinstance(args.exc_value, OSError)):
            previous(args)

    hook._expctl = True  # type: ignore[attr-defined]
    threading.excepthook = hook


@register("loggers", "csv")
class CSV(Logger):
    """RUN_DIR/metrics.csv: one row per event (step, epoch, metrics), as in metrics.jsonl.

    The header holds every metric seen so far: one first seen later (val/acc after the first
    train rows) widens it, and the file is rewritten, with blank cells where a row has no value.
    A resumed run starts from the rows metrics.jsonl kept (those before its checkpoint)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunDir(run_dir).csv
        self.rows = [
            {k: v for k, v in r.items() if k != "time"} for r in RunDir(run_dir).metric_rows()
        ]
        self.columns: list[str] = []
        self._rewrite()

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **metrics}
        self.rows.append(row)
        if any(k not in self.columns for k in row):
            self._rewrite()
            return
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns).writerow(row)

    def _rewrite(self) -> None:
        """The whole file with every column seen so far, written atomically."""
        for row in self.rows:
            self.columns += [k for k in row if k not in self.columns]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, self.columns or ["step", "epoch"])
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomically(self.path, text.getvalue())


_MLFLOW_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
_MLFLOW_BATCH = 100  # MLflow's limit of params per log_batch call


MLFLOW_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks", "file")


def _mlflow_check(tracking_uri: str | None = None, **_: Any) -> None:
    """Before a run directory exists: mlflow is installed, and the tracking URI has a scheme
    MLflow stores runs under (a relative SQLite path is made absolute by composition)."""
    _requires("mlflow", "mlflow")()
    if tracking_uri is None:
        return
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0] if ":" in tracking_uri else ""
    if scheme not in MLFLOW_SCHEMES:
        raise UserError(
            f"logger.mlflow.tracking_uri: '{tracking_uri}' has no scheme MLflow tracks to "
            f"(one of: {', '.join(MLFLOW_SCHEMES)})",
            "e.g. logger.mlflow.tracking_uri=sqlite:///$PWD/mlruns.db or http://HOST:5000",
        )


@register("loggers", "mlflow", check=_mlflow_check)
class MLflow(Logger):
    """An MLflow run: the flattened config as params, the metrics at their steps.

    A resumed run continues its MLflow run (found by the tag expctl.run_dir)."""

    def __init__(
        self,
        run_dir: Path,
        start_step: int = 0,
        tracking_uri: str | None = None,  # null: MLFLOW_TRACKING_URI, else MLflow's default
        experiment: str = "expctl",
        run_name: str | None = None,  # null: the run directory's name
    ) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 - optional: expctl[mlflow]

        self.client = MlflowClient(tracking_uri)
        found = self.client.get_experiment_by_name(experiment)
        eid = found.experiment_id if found else self.client.create_experiment(experiment)
        key = str(Path(run_dir).resolve())
        runs = (
            self.client.search_runs(
                [eid], filter_string=f"tags.`expctl.run_dir` = '{key}'", max_results=1
            )
            if start_step and "'" not in key
            else []
        )
        self.resumed = bool(runs)
        if runs:
            self.run_id = runs[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = run_name or Path(run_dir).name
            run = self.client.create_run(eid, run_name=name, tags={"expctl.run_dir": key})
            self.run_id = run.info.run_id

    def log_hparams(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415 - optional: expctl[mlflow]

        if self.resumed:
            return  # logged by the first attempt (MLflow refuses a changed value)
        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _MLFLOW_BATCH])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 - optional: expctl[mlflow]

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=items)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, _MLFLOW_STATUS.get(status, "KILLED"))


def _wandb_mode(mode: str = "offline", **_: Any) -> None:
    _requires("wandb", "wandb")()
    if mode not in ("offline", "online", "disabled"):
        raise UserError(
            f"logger.wandb.mode: '{mode}' is not one of: offline, online, disabled",
            "offline writes RUN_DIR/wandb (`wandb sync` uploads it later); online needs a login",
        )


@register("loggers", "wandb", check=_wandb_mode)
class WandB(Logger):
    """A Weights & Biases run, offline by default (files in RUN_DIR/wandb).

    `wandb sync RUN_DIR/wandb/offline-run-*` uploads an offline run; a resumed run continues
    the same W&B run (its id comes from the run directory's path)."""

    def __init__(
        self,
        run_dir: Path,
        project: str = "expctl",
        entity: str | None = None,
        mode: str = "offline",  # offline | online | disabled
        name: str | None = None,  # null: the run directory's name
    ) -> None:
        import wandb  # noqa: PLC0415 - optional: expctl[wandb]

        path = Path(run_dir).resolve()
        self.run = wandb.init(
            dir=str(path),
            project=project,
            entity=entity,
            mode=mode,  # type: ignore[arg-type]
            name=name or path.name,
            id=hashlib.sha256(str(path).encode()).hexdigest()[:16],  # the same run when resumed
            resume="allow",
            settings=wandb.Settings(console="off", silent=True),  # expctl owns the console
        )

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status in ("completed", "stopped") else 1)
