"""`expctl sweep best`: a sweep's best configuration (with repeats, by the mean over its seeds),
and its config written as SWEEP_DIR/best.yml, usable with -C (a PBT trial's with the schedule
that made its weights).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from expctl.atomic import write_atomically
from expctl.config import frozen as config_mod
from expctl.errors import RunError, UserError
from expctl.jobs import pbt
from expctl.layout import RunDir, SweepDir
from expctl.sweep import aggregate, ledger


@dataclass
class Best:
    """The best configuration of a sweep (with repeats: by the mean over its seeds)."""

    trials: list[ledger.Row]  # its completed trials: one, or one per completed seed
    value: float  # the trial's metric, or the mean over the seeds
    std: float | None  # the spread over its completed seeds; None: fewer than two
    runs: int  # its trials, completed or not
    metric: str
    path: Path  # SWEEP_DIR/best.yml

    @property
    def label(self) -> str:
        """The configuration's overrides (without a repeat's seed)."""
        return aggregate.config_label(self.trials[0])

    @property
    def repeats(self) -> bool:
        """Whether the configuration was trained with several seeds (`--repeat`)."""
        return self.runs > 1

    @property
    def spread(self) -> str:
        """` ± std` over its completed seeds ('' with fewer than two)."""
        return "" if self.std is None else f" ± {self.std:.2g}"

    @property
    def seeds(self) -> str:
        done = len(self.trials)
        return f"{done} seed(s)" if done == self.runs else f"{done} of {self.runs} seed(s)"

    def describe(self) -> str:
        """What `expctl sweep best` and the end of a sweep print: with repeats, the mean ± std
        over the seeds of the best configuration (its test metrics too), as the table ranks it."""
        results = [RunDir(r.run_dir).read_result() for r in self.trials]
        keys = [k for k in results[0] if k.startswith("test/") and all(k in x for x in results)]
        top = self.trials[0]
        label = self.label if self.repeats else top.overrides
        said = label if label.startswith("(") else f"({label}{_copies(top)})"
        if not self.repeats:
            parts = [f"best trial {top.number}: {self.metric}={self.value:.4g}"]
            parts += [f"{k}={results[0][k]:.4g}" for k in keys]
        else:
            numbers = ", ".join(str(r.number) for r in self.trials)
            parts = [
                f"best configuration: {self.metric}={self.value:.4g}{self.spread} over "
                f"{self.seeds} (trials {numbers})"
            ]
            parts += [f"{k}={_spread([float(x[k]) for x in results])}" for k in keys]
        where = "" if self.repeats else f"\n  its directory: {top.run_dir}"
        return (
            "  ".join([*parts, said])
            + where
            + f"\n  its config: {self.path}  (expctl run -C {self.path})"
        )


def _copies(r: ledger.Row) -> str:
    """A PBT trial's copies in brief: its values changed on the way (best.yml replays them)."""
    if not r.lineage:
        return ""
    last = r.lineage[-1]
    values = " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in last["params"].items()
    )
    n = len(r.lineage)
    return (
        f"; then {n} PBT cop{'y' if n == 1 else 'ies'}, the last of trial {last['from_trial']} "
        f"at step {last['step']} with {values}"
    )


def _spread(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.4g} ± {std:.2g}"


def _best(
    rs: list[ledger.Row], mode: str
) -> tuple[list[ledger.Row], float, float | None, int] | None:
    """The best configuration's completed trials, its value, spread and number of trials."""
    seeds = aggregate.repeated(rs)
    candidates = aggregate.groups(rs) if seeds else [[r] for r in rs]
    scored = [(g, m) for g in candidates if (m := aggregate.mean(g)) is not None]
    if not scored:
        return None
    g, value = min(scored, key=lambda gm: aggregate.sort_key(gm[1], mode))
    return aggregate.done(g), value, aggregate.std(g), len(g)


def _replay(cfg: dict[str, Any], timeline: list[tuple[int, dict[str, Any]]]) -> None:
    """Set a frozen config's values to a PBT timeline's first ones, the rest as its schedule."""
    (_, first), *later = timeline
    for key, value in first.items():
        section, _, arg = key.partition(".")
        cfg[section][arg] = value
    cfg["train"]["hparam_schedule"] = [pbt.entry(step, values) for step, values in later]


def _threads_note(run_dir: str) -> str:
    """A comment on the cores the trial trained on: torch's CPU threads follow them, and a sum
    split over another number of threads rounds differently (the metric moves in its last
    digits); '' when the trial's attempts do not say."""
    launches = RunDir(run_dir).read_provenance().get("launches") or [{}]
    attempt = (launches[-1].get("attempts") or [{}])[-1]
    cores = attempt.get("cpus_usable")
    if not isinstance(cores, int) or attempt.get("gpus"):
        return ""
    which = "0" if cores == 1 else f"0-{cores - 1}"
    return (
        f"# trained on {cores} core(s): on the CPU, as many repeat its metric bit for bit "
        f"(taskset -c {which} expctl run -C best.yml); other counts round sums differently\n"
    )


def best(sweep_dir: str | Path) -> Best:
    """The best configuration; writes SWEEP_DIR/best.yml, its config (with the base config's
    seed, not one repeat's), usable with -C."""
    path = Path(sweep_dir).absolute()
    s = ledger.settings(path)
    every = ledger.rows(path)
    found = _best(every, s.mode)
    if found is None:
        raise UserError(f"{path}: no completed trial yet", f"see `expctl sweep table {path}`")
    top = Best(*found, s.metric, SweepDir(path).best)
    first = top.trials[0]
    if first.foreign:
        raise UserError(
            f"trial {first.number} is the best by the sweep's record, but {first.run_dir} holds "
            "a run the sweep did not start: its config is not the trial's, best.yml not written",
            f"put trial {first.number}'s own folder back, or train its values "
            f"({first.overrides}) in a new sweep",
        )
    cfg = config_mod.load(first.run_dir).to_dict()
    cfg["run"]["dir"] = None
    cfg["train"]["seed"] -= first.seed_idx
    cfg.pop("sweep", None)
    if s.scheduler == "pbt":  # the schedule that made its weights, from step 0
        _replay(
            cfg,
            pbt.timeline(
                first.number,
                {r.number: r.params for r in every},
                {r.number: r.lineage for r in every},
            ),
        )
    if not top.repeats:
        said = first.overrides
        if s.scheduler == "pbt" and first.lineage:  # its weights began in another trial
            said = (
                f"the values its weights trained with from step 0, over {len(first.lineage)} "
                "PBT cop(ies): below, then train.hparam_schedule"
            )
        header = f"# best trial {first.number} of {path} ({s.metric}={top.value:.6g}): {said}\n"
    else:
        numbers = ", ".join(str(r.number) for r in top.trials)
        header = (
            f"# best configuration of {path} ({s.metric}={top.value:.6g}{top.spread} over "
            f"trials {numbers}): {top.label}\n"
        )
    header += _threads_note(first.run_dir)
    imports = RunDir(first.run_dir).imports  # -C best.yml finds the trial's modules anywhere
    target = SweepDir(path).imports
    try:  # each file whole or not at all; best.yml, last, completes the pair
        if imports.is_file():
            write_atomically(target, imports.read_bytes())
        else:
            target.unlink(missing_ok=True)
        target = top.path
        write_atomically(target, header + OmegaConf.to_yaml(OmegaConf.create(cfg)))
    except OSError as e:
        raise RunError(
            f"could not write {target} ({e.strerror or e}): free space in {path}, then run "
            f"`expctl sweep best {path}` again"
        ) from None
    return top
