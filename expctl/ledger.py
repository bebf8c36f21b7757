"""Reading a sweep: `expctl sweep table | best | resume | plot SWEEP_DIR`.

The ledger is the sweep's Optuna journal (SWEEP_DIR/journal.log): per trial its status, the
overrides that define it, the metric it reported, its wall time and, when it failed, the first
line of the error. It can be read while trials still run.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl.errors import UserError

STATES = {
    "RUNNING": "running",
    "WAITING": "pending",
    "COMPLETE": "completed",
    "PRUNED": "stopped",
    "FAIL": "failed",
}


@dataclass
class Row:
    """One trial of the ledger."""

    number: int
    status: str
    overrides: str
    config: str  # the swept values as JSON: trials with equal `config` are repeats
    value: float | None
    best: float | None
    epoch: int | None
    wall_s: float | None
    error: str
    run_dir: str
    params: dict[str, Any]


def _settings(sweep_dir: Path) -> Any:
    from expctl import config as config_mod

    trials = sorted(sweep_dir.glob("trial_*/config.yaml"))
    if not (sweep_dir / "journal.log").is_file():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (no journal.log)",
            "pass the folder `expctl run -m` printed",
        )
    if trials:
        return config_mod.load(trials[0].parent).sweep
    from expctl.config import SweepConfig

    return SweepConfig()


def rows(sweep_dir: str | Path) -> list[Row]:
    """Every live trial (retried ones replaced by their retry), in trial order."""
    from expctl.study import open_study

    path = Path(sweep_dir)
    s = _settings(path)
    study = open_study(path, s)
    trials = study.get_trials(deepcopy=False)
    retried = {int(t.user_attrs["retry_of"]) for t in trials if "retry_of" in t.user_attrs}
    open_attrs = [
        t.user_attrs for t in trials if t.user_attrs.get("status") in ("running", "pending")
    ]
    jobs = [j for j in map(_job_of, open_attrs) if j is not None]
    states = {}
    if jobs and shutil.which("squeue"):
        from expctl.slurm import job_states

        states = job_states(jobs)
    out = []
    for t in trials:
        if t.number in retried:
            continue
        a = t.user_attrs
        status = a.get("status") or STATES.get(t.state.name, t.state.name.lower())
        if status in ("running", "pending") and not _alive(a, states):
            status = "lost"
        history = _history(Path(a.get("run_dir", "")), s.metric)
        best = (max(history) if s.mode == "max" else min(history)) if history else None
        wall = a["ended"] - a["started"] if "ended" in a and "started" in a else None
        value = t.value if t.value is not None else (history[-1] if history else None)
        out.append(
            Row(
                t.number,
                status,
                a.get("overrides", ""),
                a.get("config", "{}"),
                value,
                best,
                a.get("epoch"),
                wall,
                a.get("error", ""),
                a.get("run_dir", ""),
                dict(t.params),
            )
        )
    return out


def _job_of(attrs: dict[str, Any]) -> str | None:
    jobs = Path(attrs.get("run_dir", "")) / "jobs.jsonl"
    lines = jobs.read_text().splitlines() if jobs.is_file() else []
    return str(json.loads(lines[-1])["job_id"]) if lines else None


def _alive(attrs: dict[str, Any], states: dict[str, dict[str, str]]) -> bool:
    """Whether a trial still marked pending/running has a live process or Slurm job (a job
    Slurm cannot tell us about counts as alive: only a final state makes a trial lost)."""
    from expctl.slurm import FINAL_STATES

    job = _job_of(attrs)
    if job is not None:
        return states.get(job, {}).get("state", "UNKNOWN") not in FINAL_STATES
    pid, host = attrs.get("pid"), attrs.get("host")
    if pid is None:
        return attrs.get("status") == "pending"
    if host != socket.gethostname():
        return True  # cannot tell from here
    try:
        os.kill(int(pid), 0)
        return True
    except OSError:
        return False


def _history(run_dir: Path, metric: str) -> list[float]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event.get(metric), (int, float)):
            out.append(float(event[metric]))
    return out


def table(sweep_dir: str | Path) -> str:
    """One row per trial (or per configuration, with repeats: mean ± std), best first."""
    path = Path(sweep_dir)
    s = _settings(path)
    rs = rows(path)
    sign = -1 if s.mode == "max" else 1

    def key(value: float | None) -> float:
        return sign * value if value is not None and math.isfinite(value) else math.inf

    groups: dict[str, list[Row]] = {}
    for r in rs:
        groups.setdefault(r.config, []).append(r)
    repeated = any(len(g) > 1 for g in groups.values())
    head = f"{'trial':>5}  {'status':<9} {s.metric:>12} {'best':>8} {'epochs':>6} {'wall s':>7}  overrides"
    lines = [f"sweep {path}  ({len(rs)} trial(s); {s.metric}, {s.mode})", head]
    if repeated:
        lines[1] = (
            f"{'runs':>5}  {'status':<9} {'mean':>12} {'± std':>8} {'epochs':>6} {'wall s':>7}  overrides"
        )
        for g in sorted(groups.values(), key=lambda g: key(_mean(g))):
            vals = [r.value for r in g if r.value is not None and r.status == "completed"]
            spread = statistics.stdev(vals) if len(vals) > 1 else 0.0
            status = "/".join(sorted({r.status for r in g}))
            over = g[0].overrides.rsplit(" seed#", 1)[0]
            lines.append(
                f"{len(g):>5}  {status:<9} {_f(_mean(g)):>12} {_f(spread):>8} {_i(g[0].epoch):>6} "
                f"{_f(sum(r.wall_s or 0 for r in g)):>7}  {over}"
            )
        return "\n".join(lines)
    for r in sorted(rs, key=lambda r: (key(r.value), r.number)):
        text = f"{r.number:>5}  {r.status:<9} {_f(r.value):>12} {_f(r.best):>8} {_i(r.epoch):>6} {_f(r.wall_s):>7}  {r.overrides}"
        if r.error:
            text += f"  | {r.error}"
        lines.append(text)
    return "\n".join(lines)


def _mean(g: list[Row]) -> float | None:
    vals = [r.value for r in g if r.value is not None and r.status == "completed"]
    return statistics.fmean(vals) if vals else None


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _i(v: int | None) -> str:
    return "-" if v is None else str(v)


def best(sweep_dir: str | Path) -> tuple[Row, Path]:
    """The best completed trial; writes SWEEP_DIR/best.yml (its config, usable with -C)."""
    from omegaconf import OmegaConf

    from expctl import config as config_mod

    path = Path(sweep_dir)
    s = _settings(path)
    done = [r for r in rows(path) if r.status == "completed" and r.value is not None]
    if not done:
        raise UserError(f"{path}: no completed trial yet", f"see `expctl sweep table {path}`")
    top = (max if s.mode == "max" else min)(done, key=lambda r: r.value or 0.0)
    cfg = config_mod.load(top.run_dir).to_dict()
    cfg["run"]["dir"] = None
    cfg.pop("sweep", None)
    out = path / "best.yml"
    header = f"# best trial {top.number} of {path} ({s.metric}={top.value:.6g}): {top.overrides}\n"
    out.write_text(header + OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return top, out


def plot(sweep_dir: str | Path) -> Path:
    """PNG of every trial's metric against its budget; stopped trials marked, best in bold."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("expctl sweep plot needs matplotlib", "pip install matplotlib") from None
    path = Path(sweep_dir)
    s = _settings(path)
    rs = rows(path)
    done = [r for r in rs if r.status == "completed" and r.value is not None]
    top = (
        (max if s.mode == "max" else min)(done, key=lambda r: r.value or 0.0).number
        if done
        else None
    )
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rs:
        xs, ys = _series(Path(r.run_dir), s.metric, s.budget)
        if not xs:
            continue
        bold = r.number == top
        line = ax.plot(
            xs,
            ys,
            label=f"#{r.number} {r.overrides}"[:48],
            linewidth=3.0 if bold else 1.0,
            alpha=1.0 if bold else 0.7,
            zorder=3 if bold else 2,
        )[0]
        if r.status == "stopped":
            ax.plot(
                xs[-1], ys[-1], marker="x", markersize=10, color=line.get_color(), linestyle="none"
            )
        elif r.status == "failed":
            ax.plot(
                xs[-1], ys[-1], marker="o", markersize=8, fillstyle="none", color=line.get_color()
            )
    ax.set_xlabel(s.budget)
    ax.set_ylabel(s.metric)
    ax.set_title(
        f"{path.name}: x = stopped early, bold = best" + (f" (#{top})" if top is not None else "")
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    out = path / "sweep.png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _series(run_dir: Path, metric: str, budget: str) -> tuple[list[float], list[float]]:
    xs: list[float] = []
    ys: list[float] = []
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return xs, ys
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(e.get(metric), (int, float)):
            xs.append(e[budget])
            ys.append(e[metric])
    return xs, ys
