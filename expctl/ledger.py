"""Reading a sweep: `expctl sweep table | best | resume | plot SWEEP_DIR`.

The ledger is the sweep's Optuna journal (SWEEP_DIR/journal.log): per trial its status, the
overrides that define it, the metric it reported, its wall time and, when it failed, the first
line of the error. It can be read while trials still run.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from expctl import config as config_mod
from expctl.config import SweepConfig
from expctl.errors import UserError
from expctl.layout import RunDir, SweepDir
from expctl.slurm import FINAL_STATES, job_states
from expctl.study import open_study

log = logging.getLogger("expctl")

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
    step: int | None = None  # optimizer steps done when the trial ended
    seed_idx: int = 0  # which repeat of its configuration (train.seed = the base seed + seed_idx)


def _settings(sweep_dir: Path) -> Any:
    sweep = SweepDir(sweep_dir)
    if not sweep.journal.is_file():
        raise UserError(
            f"{sweep_dir}: not a sweep directory (no {SweepDir.JOURNAL})",
            "pass the folder `expctl run -m` printed",
        )
    trials = sweep.trials()
    if trials:
        return config_mod.load(trials[0].path).sweep
    return SweepConfig()


def rows(sweep_dir: str | Path) -> list[Row]:
    """Every live trial (retried ones replaced by their retry), in trial order."""
    path = Path(sweep_dir)
    s = _settings(path)
    journal = SweepDir(path).journal
    try:
        trials = open_study(path, s).get_trials(deepcopy=False)
    except (ValueError, KeyError) as e:
        raise UserError(
            f"{journal} is damaged ({' '.join(str(e).split())[:120]})",
            "each trial's folder (trial_NNN/result.json, metrics.jsonl) still holds its results",
        ) from None
    if not journal.read_bytes().endswith(b"\n"):
        log.warning("%s: its last line is incomplete (being written, or truncated)", journal)
    recorded = {
        Path(t.user_attrs["run_dir"]).resolve() for t in trials if "run_dir" in t.user_attrs
    }
    missing = [r.path.name for r in SweepDir(path).trials() if r.path.resolve() not in recorded]
    if missing:
        log.warning(
            "%s holds no record of %s: the journal lost them", journal, ", ".join(missing[:5])
        )
    retried = {int(t.user_attrs["retry_of"]) for t in trials if "retry_of" in t.user_attrs}
    open_attrs = [
        t.user_attrs for t in trials if t.user_attrs.get("status") in ("running", "pending")
    ]
    jobs = [j for j in map(_job_of, open_attrs) if j is not None]
    states = {}
    if jobs and shutil.which("squeue"):
        states = job_states(jobs)
    out = []
    for t in trials:
        if t.number in retried:
            continue
        a = t.user_attrs
        status = a.get("status") or STATES.get(t.state.name, t.state.name.lower())
        if status in ("running", "pending") and not _alive(a, states):
            status = "lost"
        run = RunDir(a["run_dir"]) if a.get("run_dir") else None
        history = run.metric_series(s.metric)[1] if run else []
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
                a.get("step"),
                int(a.get("seed_idx", 0)),
            )
        )
    return out


def _job_of(attrs: dict[str, Any]) -> str | None:
    events = RunDir(attrs["run_dir"]).job_events() if attrs.get("run_dir") else []
    return str(events[-1]["job_id"]) if events else None


def _alive(attrs: dict[str, Any], states: dict[str, dict[str, str]]) -> bool:
    """Whether a trial still marked pending/running has a live process or Slurm job (a job
    Slurm cannot tell us about counts as alive: only a final state makes a trial lost)."""
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


def table(sweep_dir: str | Path) -> str:
    """One row per trial (or per configuration, with repeats: mean ± std), best first.

    `epochs` counts whole epochs and `steps` optimizer steps, so a trial that ended inside an
    epoch (train.max_steps) shows its progress; sampled floats are shown to 4 significant digits.
    """
    path = Path(sweep_dir)
    s = _settings(path)
    rs = rows(path)
    lines = [f"sweep {path}  ({len(rs)} trial(s); {s.metric}, {s.mode})"]
    tail = f"{'epochs':>6} {'steps':>6} {'wall s':>7}  overrides"
    if _repeated(rs):
        lines.append(f"{'runs':>5}  {'status':<9} {'mean':>12} {'± std':>8} {tail}")
        for g in sorted(_groups(rs), key=lambda g: _key(_mean(g), s.mode)):
            status = "/".join(sorted({r.status for r in g}))
            lines.append(
                f"{len(g):>5}  {status:<9} {_f(_mean(g)):>12} {_f(_std(g)):>8} "
                f"{_i(_most(r.epoch for r in g)):>6} {_i(_most(r.step for r in g)):>6} "
                f"{_f(sum(r.wall_s or 0 for r in g)):>7}  {_short(_label(g[0]), g[0].params)}"
            )
        return "\n".join(lines)
    lines.append(f"{'trial':>5}  {'status':<9} {s.metric:>12} {'best':>8} {tail}")
    for r in sorted(rs, key=lambda r: (_key(r.value, s.mode), r.number)):
        text = (
            f"{r.number:>5}  {r.status:<9} {_f(r.value):>12} {_f(r.best):>8} {_i(r.epoch):>6} "
            f"{_i(r.step):>6} {_f(r.wall_s):>7}  {_short(r.overrides, r.params)}"
        )
        if r.error:
            text += f"  | {r.error}"
        lines.append(text)
    return "\n".join(lines)


def _groups(rs: list[Row]) -> list[list[Row]]:
    """Trials by configuration (repeats of one differ only in their seed), in trial order."""
    groups: dict[str, list[Row]] = {}
    for r in rs:
        groups.setdefault(r.config, []).append(r)
    return list(groups.values())


def _repeated(rs: list[Row]) -> bool:
    return any(len(g) > 1 for g in _groups(rs))


def _label(r: Row) -> str:
    """The trial's overrides without its seed: the configuration's."""
    return r.overrides.rsplit(" seed#", 1)[0] or "(base)"


def _done(g: list[Row]) -> list[Row]:
    return [r for r in g if r.status == "completed" and r.value is not None]


def _mean(g: list[Row]) -> float | None:
    vals = [r.value for r in _done(g) if r.value is not None]
    return statistics.fmean(vals) if vals else None


def _std(g: list[Row]) -> float:
    vals = [r.value for r in _done(g) if r.value is not None]
    return statistics.stdev(vals) if len(vals) > 1 else 0.0


def _key(value: float | None, mode: str) -> float:
    """Sort key, best first: missing or non-finite values last."""
    if value is None or not math.isfinite(value):
        return math.inf
    return -value if mode == "max" else value


def _most(values: Iterable[int | None]) -> int | None:
    return max((v for v in values if v is not None), default=None)


def _short(text: str, params: dict[str, Any]) -> str:
    """`text` with sampled floats to 4 significant digits (for display: the ledger and best.yml
    keep them exact)."""
    for k, v in params.items():
        if isinstance(v, float):
            text = text.replace(f"{k}={v}", f"{k}={v:.4g}")
    return text


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _i(v: int | None) -> str:
    return "-" if v is None else str(v)


@dataclass
class Best:
    """The best configuration of a sweep (with repeats: by the mean over its seeds)."""

    trials: list[Row]  # its completed trials: one, or one per completed seed
    value: float  # the trial's metric, or the mean over the seeds
    std: float | None  # the spread over the seeds; None without repeats
    runs: int  # its trials, completed or not
    metric: str
    path: Path  # SWEEP_DIR/best.yml

    @property
    def label(self) -> str:
        """The configuration's overrides (without a repeat's seed)."""
        return _label(self.trials[0])

    @property
    def seeds(self) -> str:
        done = len(self.trials)
        return f"{done} seed(s)" if done == self.runs else f"{done} of {self.runs} seed(s)"

    def describe(self) -> str:
        """What `expctl sweep best` prints."""
        top = self.trials[0]
        if self.std is None:
            return (
                f"best trial {top.number}: {self.value:.6g}  {top.overrides}\n"
                f"  directory {top.run_dir}\n  config    {self.path}"
            )
        trials = ", ".join(f"{r.number} ({_f(r.value)})" for r in self.trials)
        return (
            f"best configuration: {self.metric}={self.value:.6g} ± {self.std:.2g} over "
            f"{self.seeds}  {self.label}\n  trials    {trials}\n  config    {self.path}"
        )


def _best(rs: list[Row], mode: str) -> tuple[list[Row], float, float | None, int] | None:
    """The best configuration's completed trials, its value, spread and number of trials."""
    repeated = _repeated(rs)
    groups = _groups(rs) if repeated else [[r] for r in rs]
    scored = [(g, m) for g in groups if (m := _mean(g)) is not None]
    if not scored:
        return None
    g, value = min(scored, key=lambda gm: _key(gm[1], mode))
    return _done(g), value, _std(g) if repeated else None, len(g)


def best(sweep_dir: str | Path) -> Best:
    """The best configuration; writes SWEEP_DIR/best.yml, its config (with the base config's
    seed, not one repeat's), usable with -C."""
    from omegaconf import OmegaConf  # lazy: keeps `sweep table` light

    path = Path(sweep_dir)
    s = _settings(path)
    found = _best(rows(path), s.mode)
    if found is None:
        raise UserError(f"{path}: no completed trial yet", f"see `expctl sweep table {path}`")
    done, value, std, runs = found
    top = Best(done, value, std, runs, s.metric, SweepDir(path).best)
    cfg = config_mod.load(done[0].run_dir).to_dict()
    cfg["run"]["dir"] = None
    cfg["train"]["seed"] -= done[0].seed_idx
    cfg.pop("sweep", None)
    if std is None:
        header = f"# best trial {done[0].number} of {path} ({s.metric}={value:.6g}): {done[0].overrides}\n"
    else:
        numbers = ", ".join(str(r.number) for r in done)
        header = (
            f"# best configuration of {path} ({s.metric}={value:.6g} ± {std:.2g} over trials "
            f"{numbers}): {_label(done[0])}\n"
        )
    top.path.write_text(header + OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return top


def plot(sweep_dir: str | Path) -> Path:
    """PNG of every trial's metric against its budget; stopped trials marked, best in bold."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise UserError("expctl sweep plot needs matplotlib", "pip install matplotlib") from None
    path = Path(sweep_dir)
    s = _settings(path)
    rs = rows(path)
    found = _best(rs, s.mode)
    top = [r.number for r in found[0]] if found else []
    fig, ax = plt.subplots(figsize=(8, 5))
    budget: list[float] = []
    for r in rs:
        xs, ys = RunDir(r.run_dir).metric_series(s.metric, x=s.budget)
        if not xs:
            continue
        budget += xs
        bold = r.number in top
        line = ax.plot(
            xs,
            ys,
            label=f"#{r.number} {_short(r.overrides, r.params)}"[:48],
            marker="o",  # a trial validated once is a point, not a line
            markersize=5 if bold else 3,
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
    if budget:  # at least one unit wide: points validated at one budget only stay readable
        lo, hi = min(budget), max(budget)
        if hi - lo < 1:
            lo, hi = lo - 0.5, hi + 0.5
        ax.set_xlim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(s.budget)
    ax.set_ylabel(s.metric)
    best_text = f" (#{', #'.join(map(str, top))})" if top else ""
    ax.set_title(f"{path.name}: x = stopped early, bold = best{best_text}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    out = SweepDir(path).plot
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
