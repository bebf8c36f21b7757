"""Loggers and the console on real tiny runs: each logger's output read back with its own
library (csv, TensorBoard's EventAccumulator, MLflow's client, W&B's offline files), a logger of
the user's, and the progress output on a terminal (a pty) and off one."""

from __future__ import annotations

import csv
import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import conftest
import pytest
from conftest import cli_env, expctl, run_dirs

from expctl.rank import report

# 32 samples in batches of 8: 4 steps an epoch, 8 in all; a train event every 2 steps
RUN = ["run", *conftest.SMALL, "train.device=cpu", "sched=none", "train.max_epochs=2"]
RUN += ["train.log_every=2"]


def _train(tmp_path: Path, *overrides: str) -> Path:
    """Train RUN with `overrides` in `tmp_path`; returns the run directory."""
    expctl(*RUN, *overrides, cwd=tmp_path)
    (run,) = run_dirs(tmp_path / "runs")
    return run


def _events(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_csv_logger_holds_every_event_with_a_header_of_every_metric(tmp_path: Path) -> None:
    run = _train(tmp_path, "logger=[csv]")
    with open(run / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    header = reader.fieldnames or []
    assert header[:2] == ["step", "epoch"]
    assert {"train/loss", "lr", "val/acc", "val/loss", "time/train_s"} <= set(header)
    events = _events(run)
    assert len(rows) == len(events) + 1, "and a last row of result.json's time/train_s"
    for row, event in zip(rows, events, strict=False):
        assert int(row["step"]) == event["step"] and int(row["epoch"]) == event["epoch"]
        for key in header[2:]:
            if key in event:
                assert float(row[key]) == pytest.approx(event[key]), (key, row, event)
            else:
                assert row[key] == "", (key, row, event)
    assert rows[-1]["time/train_s"] and rows[-1]["train/loss"] == ""


@pytest.mark.slow
def test_tensorboard_logger_writes_scalars_and_hparams(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="logger=[tensorboard] needs expctl[tensorboard]")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run = _train(tmp_path, "logger=[tensorboard]", "optim.lr=0.07")
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [2, 4, 6, 8]
    assert [e.step for e in acc.Scalars("val/acc")] == [4, 8]
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["optim.lr"].number_value == pytest.approx(0.07)
    assert start.hparams["model.name"].string_value == "mlp"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert {"val/acc", "val/loss", "train/loss", "time/train_s"} <= metrics


@pytest.mark.slow
def test_mlflow_logger_params_and_metric_history_read_back_by_mlflows_client(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mlflow", reason="logger=[mlflow] needs expctl[mlflow]")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = _train(
        tmp_path,
        "logger=[mlflow]",
        f"logger.mlflow.tracking_uri='{uri}'",
        "logger.mlflow.experiment=tiny",
    )
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tiny")
    assert experiment is not None
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == run.name and found.info.status == "FINISHED"
    assert found.data.params["optim.lr"] == "0.05" and found.data.params["model.name"] == "mlp"
    assert found.data.tags["expctl.run_dir"] == str(run.resolve())
    history = client.get_metric_history(found.info.run_id, "train/loss")
    assert [m.step for m in history] == [2, 4, 6, 8]
    losses = [e["train/loss"] for e in _events(run) if "train/loss" in e]
    assert [m.value for m in history] == pytest.approx(losses)
    assert [m.step for m in client.get_metric_history(found.info.run_id, "val/acc")] == [4, 8]


@pytest.mark.slow
def test_wandb_logger_writes_its_offline_run_under_the_run_dir(tmp_path: Path) -> None:
    pytest.importorskip("wandb", reason="logger=[wandb] needs expctl[wandb]")
    run = _train(tmp_path, "logger=[wandb,csv]")
    (offline,) = (run / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb")), sorted(p.name for p in offline.iterdir())
    assert not (tmp_path / "wandb").exists(), "nothing in the working directory"
    assert (run / "metrics.csv").is_file(), "and the other logger beside it"


RECORDER = '''\
"""A user's logger: records every call in RUN_DIR/calls.jsonl."""
import json
from pathlib import Path

from expctl import register
from expctl.builtin.loggers import Logger


@register("loggers", "recorder")
class Recorder(Logger):
    def __init__(self, run_dir: Path, tag: str = "none") -> None:
        self.path, self.tag = Path(run_dir) / "calls.jsonl", tag

    def _add(self, **call) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(call) + "\\n")

    def log_hparams(self, params):
        self._add(call="hparams", params=params)

    def log_metrics(self, metrics, step):
        self._add(call="metrics", step=step, metrics=metrics)

    def close(self, status):
        self._add(call="close", status=status, tag=self.tag)
'''


@pytest.mark.slow
def test_a_registered_logger_gets_the_calls_on_rank_0_only(tmp_path: Path) -> None:
    (tmp_path / "recorder.py").write_text(RECORDER)
    run = _train(
        tmp_path,
        "imports=[recorder]",
        "logger=[recorder]",
        "logger.recorder.tag=mine",
        "launcher=local",
        "launcher.nproc=2",
    )
    calls = [json.loads(line) for line in (run / "calls.jsonl").read_text().splitlines()]
    assert calls[0]["call"] == "hparams" and calls[0]["params"]["logger.recorder.tag"] == "mine"
    assert calls[0]["params"]["model.hidden"] == "[8]", "lists as JSON text"
    assert calls[-1] == {"call": "close", "status": "completed", "tag": "mine"}
    metrics = [c for c in calls if c["call"] == "metrics"]
    events = _events(run)  # 2 ranks: 2 steps an epoch, a train event every 2 steps
    assert [c["step"] for c in metrics[: len(events)]] == [e["step"] for e in events]
    assert len(metrics) == len(events) + 1, "one set of calls (rank 0), and the final metrics"
    assert "time/train_s" in metrics[-1]["metrics"]
    assert all("epoch" in c["metrics"] for c in metrics)


def _on_a_terminal(args: list[str], cwd: Path, columns: int) -> str:
    """What `expctl ARGS` shows on a terminal `columns` wide (a pty)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "expctl", *args],
        cwd=cwd,
        env=cli_env(),
        stdout=slave,
        stderr=subprocess.PIPE,
    )
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    return out.decode(errors="replace")


@pytest.mark.slow
def test_on_a_terminal_a_bar_moves_and_train_log_still_gets_every_train_line(
    tmp_path: Path,
) -> None:
    shown = _on_a_terminal([*RUN, "train.log_every=4"], tmp_path, columns=80)
    (run,) = run_dirs(tmp_path / "runs")
    frames = [f for f in re.split(r"[\r\n]", shown) if "%|" in f]
    assert any("step 8/8" in f and "samples/s" in f for f in frames), shown
    assert any("loss=" in f for f in frames), "the loss of the last log point"
    assert re.search(r"<\d\d:\d\d", shown), "the time left"
    assert all(len(f) <= 80 for f in frames), "within the terminal's width"
    assert "train epoch" not in shown, "the bar shows the train lines"
    assert "val epoch 1 step 4/8" in shown
    log = (run / "train.log").read_text()
    assert "train epoch 1 step 4/8" in log and "train epoch 2 step 8/8" in log, log


@pytest.mark.slow
def test_off_a_terminal_progress_is_plain_lines_with_an_eta(tmp_path: Path) -> None:
    out = expctl(*RUN, cwd=tmp_path).stdout
    assert "\r" not in out and "%|" not in out
    trains = [line for line in out.splitlines() if line.startswith("train epoch")]
    assert len(trains) == 4 and all(re.search(r"eta \d\d:\d\d$", t) for t in trains), out
    (run,) = run_dirs(tmp_path / "runs")
    assert not (run / "tb").exists() and not (run / "metrics.csv").exists(), "no logger picked"


def test_rates_show_in_full_with_thousands_separators() -> None:
    assert report._fmt(39970.2) == "39,970"
    assert report._fmt(0.123456) == "0.1235"
    assert report._fmt(float("nan")) == "nan"
