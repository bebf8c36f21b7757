"""`expctl sweep resume`: a sweep's unfinished trials run again, in their own directories from
their checkpoints, with the ones it never got to; one driver at a time (`multirun.driving`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from expctl.config import compose
from expctl.config import frozen as config_mod
from expctl.config.schema import SWEEP_DRIVER_KEYS
from expctl.errors import UserError, did_you_mean
from expctl.jobs.study import TrialRef, attrs_of, mark
from expctl.layout import SweepDir
from expctl.rank.provenance import Launch
from expctl.rank.runlock import is_locked
from expctl.sweep import ledger, trials
from expctl.sweep.multirun import Outcome, Slot, driving, outcome, run_trials
from expctl.sweep.unchanged import check_points, check_unchanged

log = logging.getLogger("expctl")


def _closest(key: str) -> str:
    """Did-you-mean among the settings a resume may change, by the name after `sweep.`."""
    names = [k.removeprefix("sweep.") for k in RESUMABLE]
    said = did_you_mean(key.removeprefix("sweep."), names) if key.startswith("sweep.") else ""
    return said.replace("'", "'sweep.", 1)


def _repair_journal(journal: Path) -> None:
    """A crash mid-write leaves the journal's last record torn (never committed): drop it before
    appending, or the next record would be glued to it and the journal unreadable."""
    data = journal.read_bytes() if journal.is_file() else b""  # (none: refused when read)
    if data and not data.endswith(b"\n"):
        journal.write_bytes(data[: data.rfind(b"\n") + 1])
        log.warning("%s: dropped an incomplete last record (a crash while writing it)", journal)


def _finish_cut_copies(path: Path) -> None:
    """PBT trials that died while becoming a copy of a better one (its decision recorded, the
    copy not): finish the copy here, as a requeued Slurm job does, so each resumes as what its
    checkpoint may already be (the donor's state) with its explored values and lineage, not as
    its old self."""
    from expctl.jobs.exploit import continue_as_copy  # noqa: PLC0415 - torch off the driver

    for r in ledger.rows(path):
        ref = TrialRef.read(r.run_dir) if r.status in ledger.UNFINISHED else None
        if ref is None or not attrs_of(ref).get("pbt_next"):
            continue
        mark(ref, "copying")  # (a crashed copy was marked failed)
        cfg = config_mod.load(r.run_dir).replace("run", dir=r.run_dir)
        try:
            continue_as_copy(cfg)
        except (OSError, ValueError) as e:  # the donor's frozen state is gone or damaged
            mark(ref, r.status, pbt_next=None)
            log.warning(
                "trial %d: its PBT copy cannot be finished (%s): it resumes as it was", r.number, e
            )


# what a resume may change: how the trials use the machine, and whether a failure stops them
# (another value of what they train would mix two sweeps in one)
RESUMABLE = SWEEP_DRIVER_KEYS


def resume(
    sweep_dir: str | Path, overrides: Sequence[str] = (), skip_failed: bool = False
) -> Outcome:
    """Re-run the trials that failed (unless `skip_failed`), were interrupted or were lost (in
    their own directories, resuming their checkpoints), and the ones the sweep never got to,
    with `overrides` of the RESUMABLE settings (`sweep.max_concurrent=4`: on another machine)."""
    for o in overrides:
        if o.partition("=")[0].lstrip("+") not in RESUMABLE:
            key = o.partition("=")[0].lstrip("+")
            raise UserError(
                f"`expctl sweep resume` cannot change {key}: the sweep's trials keep the "
                f"configuration they started with.{_closest(key)}",
                f"it may change {', '.join(RESUMABLE)}; for other values, start a new sweep",
            )
    path = Path(sweep_dir).absolute()
    ledger.require(path)
    with driving(path):
        return _resume(path, list(overrides), skip_failed)


def _resume(path: Path, overrides: list[str], skip_failed: bool) -> Outcome:
    import optuna  # noqa: PLC0415 - Optuna off `run -m`'s checks: a bad sweep fails without it

    spec = SweepDir(path).read_spec(resuming=True)
    check_unchanged(spec)
    frozen = SweepDir(path).trials()
    base = (
        config_mod.load(frozen[0].path)
        if frozen
        else compose.compose(spec["config_file"], spec["plain"])
    )
    if overrides:  # checked as `run` checks them (types, bounds), before anything changes
        given = compose.compose(spec["config_file"], [*spec["plain"], *overrides]).sweep
        keys = [o.partition("=")[0].lstrip("+").removeprefix("sweep.") for o in overrides]
        base = base.replace("sweep", **{k: getattr(given, k) for k in keys})
    if base.launcher.name != "slurm":  # a share this machine cannot give: before any change
        trials.plan_for(base, 1)
    rows = ledger.rows(path)
    check_points(spec, rows)  # a group file only a later point picks: before any change
    for r in rows:  # a trial's folder another launch trains: before any change
        if r.status in ledger.UNFINISHED and (holder := is_locked(Path(r.run_dir))):
            raise UserError(
                f"trial {r.number} ({r.run_dir}) is being trained by another launch ({holder})",
                "let it end (or stop it), then resume the sweep",
            )
    _repair_journal(SweepDir(path).journal)
    if base.sweep.scheduler == "pbt":
        _finish_cut_copies(path)
    study = ledger.read_study(path, base.sweep, to_write=True)
    todo: list[Slot] = []
    for r in ledger.rows(path):
        if r.status == "failed" and skip_failed:
            continue
        if r.status in ledger.UNFINISHED:
            assert r.optuna_trial is not None, "a trial that ended was started"
            study.tell(r.optuna_trial, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx, True, r.lineage))
        elif r.optuna_trial is None:  # never started
            todo.append(Slot(r.number, json.loads(r.config), r.seed_idx))
    if not todo:
        what = "completed, was stopped or failed" if skip_failed else "completed or was stopped"
        print(f"expctl: nothing to resume in {path}: every trial {what}")
        return outcome(path)
    print(f"expctl: resuming {len(todo)} trial(s) of {path}", flush=True)
    return run_trials(path, base, todo, Launch.here(spec["config_file"]).pin())
