"""`expctl sweep plot`: Optuna's matplotlib visualisations of a sweep, as PNG files beside it.

Optuna draws each figure (`optuna.visualization.matplotlib`) from an in-memory copy of the
sweep's study whose trials are numbered as the sweep's are (trial N lives in trial_00N; a retry
replaces the attempt it repeats), so the plots, `expctl sweep table` and the folders agree:

    plot_intermediate_values.png   the metric at each validation, per trial (reported by every trial)
    plot_slice.png                 the metric against each parameter, on its own scale (log for log ones)
    plot_param_importances.png     which parameter mattered (PED-ANOVA)
    plot_parallel_coordinate.png   every completed trial across all parameters
    plot_pbt.png                   PBT: each trial's metric and hyperparameters over its steps
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from expctl.atomic import write_atomically
from expctl.config.schema import SweepConfig
from expctl.errors import RunError, UserError
from expctl.jobs.study import open_study
from expctl.layout import RunDir, SweepDir, json_lines
from expctl.sweep import ledger
from expctl.sweep.ledger import Row

LEGEND_MAX = 10  # more trials than this: their numbers crowd the figure; the table has them


@dataclass
class Plots:
    """What `plot` wrote, and what it left out and why."""

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """What `expctl sweep plot` prints."""
        lines = [f"expctl: wrote {p}" for p in self.written]
        lines += [f"expctl: skipped plot_{k}: {why}" for k, why in self.skipped.items()]
        return "\n".join(lines)


def plot(sweep_dir: str | Path) -> Plots:
    """Write the sweep's plots (each one its data allows) as SWEEP_DIR/plot_*.png.

    Raises:
        UserError: matplotlib (the `plot` extra) is missing, or SWEEP_DIR is no sweep.
    """
    path = Path(sweep_dir)
    s = ledger.settings(path)  # before matplotlib, which builds its font cache in ~ on import
    plt, vis, optuna = _imports()
    rows = ledger.rows(path)
    study = _study(path, s, rows)
    done = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    varying = [k for k in dict.fromkeys(p for t in done for p in t.params) if _varies(k, done)]
    drawn = [t for t in study.get_trials() if t.intermediate_values]
    few = f"needs >= 2 completed trials (has {len(done)})"
    why = few if len(done) < 2 else None
    if s.scheduler == "pbt":  # a trial's values change as it trains: the first ones tell little
        why = "PBT changes each trial's values as it trains: plot_pbt.png draws them over its steps"
    many = why or (None if len(varying) >= 2 else _ONE if varying else _FIXED)
    figures: dict[str, tuple[str | None, Callable[[], Any]]] = {
        "intermediate_values": (
            None if drawn else "no trial has reported a validation yet",
            lambda: progress_figure(vis.plot_intermediate_values(study), s, len(drawn)),
        ),
        "slice": (
            why or (None if varying else _FIXED),
            lambda: vis.plot_slice(study, params=varying, target_name=s.metric),
        ),
        "param_importances": (
            many,
            lambda: vis.plot_param_importances(study, params=varying, target_name=s.metric),
        ),
        "parallel_coordinate": (
            many,
            lambda: vis.plot_parallel_coordinate(study, params=varying, target_name=s.metric),
        ),
    }
    if s.scheduler == "pbt":
        figures["pbt"] = (
            None if any(r.run_dir for r in rows) else "no trial has started yet",
            lambda: pbt_figure(plt, s, rows),
        )
    out = Plots()
    for name, (why, draw) in figures.items():
        if why is not None:
            out.skipped[name] = why
            continue
        with plt.rc_context(), warnings.catch_warnings():  # Optuna sets its own style
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            fig = _figure(draw())
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=110, bbox_inches="tight")
            plt.close(fig)
        out.written.append(_write(SweepDir(path).plot(name), png.getvalue(), path))
    return out


def _write(target: Path, png: bytes, sweep: Path) -> Path:
    """Write a plot whole or not at all (a full disk left a truncated image and a traceback)."""
    try:
        write_atomically(target, png)
    except OSError as e:
        raise RunError(
            f"could not write {target} ({e.strerror or e}): free space in {sweep}, then run "
            f"`expctl sweep plot {sweep}` again"
        ) from None
    return target


_FIXED = "no swept parameter takes two or more values among the completed trials"
_ONE = (
    "only one swept parameter takes two or more values among the completed trials: "
    "nothing to set it beside"
)


def _imports() -> tuple[Any, Any, Any]:
    try:
        import matplotlib  # noqa: PLC0415 - optional (expctl[plot]): missing, a UserError

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 - after matplotlib.use
    except ImportError:
        raise UserError(
            "expctl sweep plot needs matplotlib, which is not installed",
            "pip install 'expctl[plot]' (or pip install matplotlib)",
        ) from None
    import optuna.visualization.matplotlib as vis  # noqa: PLC0415 - it imports pyplot

    return plt, vis, optuna


def _study(path: Path, s: SweepConfig, rows: list[Row]) -> Any:
    """An in-memory study holding each trial's latest attempt, numbered as the sweep's trials
    (those not started as waiting ones, which no plot draws)."""
    attempts = {t.number: t for t in open_study(path, s).get_trials(deepcopy=False)}
    study = optuna.create_study(direction="maximize" if s.mode == "max" else "minimize")
    for r in rows:  # by number, from 0: Optuna numbers them as they come
        t = attempts.get(r.optuna_trial) if r.optuna_trial is not None else None
        if t is None:
            study.add_trial(create_trial(state=TrialState.WAITING))
            continue
        state = {
            "completed": TrialState.COMPLETE,
            "stopped": TrialState.PRUNED,
            "running": TrialState.RUNNING,
        }.get(r.status, TrialState.FAIL)
        if state == TrialState.COMPLETE and (t.value is None or math.isnan(t.value)):
            state = TrialState.FAIL  # a diverged trial (NaN) has no place on a metric axis
        numeric = {k: _numeric(d) for k, d in t.distributions.items()}
        study.add_trial(
            create_trial(
                state=state,
                value=t.value if state == TrialState.COMPLETE else None,
                params={k: _value(v) if numeric[k] else v for k, v in t.params.items()},
                distributions={k: numeric[k] or d for k, d in t.distributions.items()},
                intermediate_values=t.intermediate_values,
            )
        )
    return study


def _numeric(dist: Any) -> Any:
    """Grid points that are all numbers as a range (log when they span two decades or more):
    a plot puts them on an axis in order, not as labels. None for any other distribution."""
    if not isinstance(dist, CategoricalDistribution):
        return None
    values = [_value(c) for c in dist.choices]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    lo, hi = min(values), max(values)
    log = lo > 0 and hi >= 100 * lo
    if all(isinstance(v, int) for v in values):
        return IntDistribution(int(lo), int(hi), log=log)
    return FloatDistribution(float(lo), float(hi), log=log)


def _value(text: Any) -> Any:
    return ledger.typed({"v": text})["v"]


def _varies(key: str, trials: list[Any]) -> bool:
    values = {json.dumps(t.params[key]) for t in trials if key in t.params}
    return len(values) > 1


def progress_figure(ax: Any, s: SweepConfig, n: int) -> Any:
    """Optuna's figure, labelled in the sweep's words; its legend only while it stays legible."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415 - matplotlib is optional

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
    ax.set_xlabel(s.budget)
    ax.set_ylabel(s.metric)
    ax.set_title(f"{s.metric} per {s.budget}, {n} trial(s)")
    if n > LEGEND_MAX and ax.get_legend() is not None:
        ax.get_legend().remove()
        ax.set_title(f"{s.metric} per {s.budget}, {n} trials (numbers: expctl sweep table)")
    return ax


def pbt_figure(plt: Any, s: SweepConfig, rows: list[Row]) -> Any:
    """Population Based Training: each trial's metric over its steps (above) and the value of
    each mutated hyperparameter it trained with (below), a segment per copy: a trial that
    copied another continues from that trial's step."""
    keys = sorted({k for r in rows for k in r.params})
    fig, axes = plt.subplots(1 + len(keys), 1, figsize=(8, 3 + 2 * len(keys)), sharex=True)
    axes = list(axes) if len(keys) else [axes]
    colours = plt.get_cmap("tab10")
    for i, r in enumerate(rows):
        starts = [0, *(int(e["step"]) for e in r.lineage)]  # where each segment's weights began
        for segment, (values, points) in enumerate(_segments(r, s.metric)):
            if not points:
                continue
            steps, metric = zip(*points, strict=True)
            label = f"trial {r.number}" if segment == 0 and len(rows) <= LEGEND_MAX else None
            colour = colours(i % 10)
            axes[0].plot(steps, metric, marker=".", color=colour, label=label)
            for ax, key in zip(axes[1:], keys, strict=True):
                if isinstance(values.get(key), (int, float)):  # from its start: never a dot
                    ax.plot([starts[segment], steps[-1]], [values[key]] * 2, color=colour)
    axes[0].set_ylabel(s.metric)
    axes[0].set_title(f"{s.metric} and each trial's hyperparameters (PBT; a segment per copy)")
    if len(rows) <= LEGEND_MAX:
        axes[0].legend(fontsize="small")
    for ax, key in zip(axes[1:], keys, strict=True):
        ax.set_ylabel(key)
        if key.endswith("lr"):
            ax.set_yscale("log")
    axes[-1].set_xlabel("step")
    return fig


def _segments(r: Row, metric: str) -> list[tuple[dict[str, Any], list[tuple[int, float]]]]:
    """A trial's validation points cut where it copied another trial, each with its values."""
    history = json_lines(RunDir(r.run_dir).metrics) if r.run_dir else []
    cuts = [int(e.get("row", len(history))) for e in r.lineage] + [len(history)]
    values = [dict(r.params), *(dict(e["params"]) for e in r.lineage)]
    out, start = [], 0
    for end, v in zip(cuts, values, strict=True):
        points = [(int(x["step"]), float(x[metric])) for x in history[start:end] if metric in x]
        out.append((v, points))
        start = end
    return out


def _figure(drawn: Any) -> Any:
    """The figure of what an Optuna plot returned: one Axes, or an array of them."""
    return drawn.figure if hasattr(drawn, "figure") else drawn.flat[0].figure
