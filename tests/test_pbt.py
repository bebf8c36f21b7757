"""Population Based Training: the decisions (pure), a copy made of real checkpoint files, and a
population trained on the CPU whose best trial's schedule, replayed from best.yml, gives its
metric again."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest
from conftest import cli_env
from conftest import expctl as run_cli

from expctl.config import compose
from expctl.config.schema import PBTConfig
from expctl.errors import UserError
from expctl.jobs import exploit, pbt

# ---------------------------------------------------------------------------------------------
# decisions: pure
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "mode", "copies"),
    [
        ({0: 0.9, 1: 0.5, 2: 0.7, 3: 0.8}, "max", {1: {0}}),  # 4 x 0.25: the worst copies the best
        ({0: 0.1, 1: 0.5, 2: 0.7, 3: 0.8}, "min", {3: {0}}),
        ({0: 0.9, 1: 0.5}, "max", {1: {0}}),
        ({0: 0.9}, "max", {}),  # alone: nobody to copy
        ({0: float("nan"), 1: 0.5, 2: 0.7, 3: 0.8}, "max", {0: {3}}),  # NaN: the worst
    ],
)
def test_the_bottom_quantile_copies_the_top_one(
    scores: dict[int, float], mode: str, copies: dict[int, set[int]]
) -> None:
    for me in scores:
        donors = {pbt.decide(me, scores, 0.25, mode, random.Random(s)) for s in range(20)}
        assert donors == (copies.get(me) or {None}), me


def test_a_quantile_takes_the_worst_and_best_k_and_never_overlaps() -> None:
    scores = {n: float(n) for n in range(8)}  # max: 0 is the worst
    picked = {pbt.decide(1, scores, 0.25, "max", random.Random(s)) for s in range(50)}
    assert picked == {6, 7}, "top 2 of 8"
    assert pbt.decide(2, scores, 0.25, "max", random.Random(0)) is None, "not in the bottom 2"
    half = {pbt.decide(3, scores, 0.5, "max", random.Random(s)) for s in range(50)}
    assert half == {4, 5, 6, 7}


DIMS = [
    {"key": "optim.lr", "values": None, "low": 1e-4, "high": 1e-1, "log": True, "integer": False},
    {"key": "optim.momentum", "values": ["0.0", "0.5", "0.9"], "low": None, "high": None},
    {"key": "loss.label_smoothing", "values": None, "low": 0.0, "high": 0.2, "log": False},
]


def test_explore_perturbs_by_the_factors_within_the_interval_or_steps_a_list() -> None:
    p = PBTConfig(resample_probability=0.0, factors=[0.8, 1.2])
    params = {"optim.lr": 0.01, "optim.momentum": 0.5, "loss.label_smoothing": 0.19}
    seen_lr, seen_m, seen_ls = set(), set(), set()
    for s in range(40):
        new = pbt.explore(params, DIMS, p, random.Random(s))
        seen_lr.add(round(new["optim.lr"], 6))
        seen_m.add(new["optim.momentum"])
        seen_ls.add(round(new["loss.label_smoothing"], 6))
    assert seen_lr == {0.008, 0.012} and seen_m == {0.0, 0.9}
    assert seen_ls == {0.152, 0.2}, "0.19 x 1.2 is kept inside the interval's 0.2"
    # a number at an end of its interval moves the way it can; a listed value stays half the time
    ends = {"optim.lr": 0.1, "optim.momentum": 0.9, "loss.label_smoothing": 0.0}
    moved = [pbt.explore(ends, DIMS, p, random.Random(s)) for s in range(40)]
    assert {round(m["optim.lr"], 6) for m in moved} == {0.08}
    assert {m["optim.momentum"] for m in moved} == {0.5, 0.9}
    assert {m["loss.label_smoothing"] for m in moved} == {0.0}, "0 x any factor: nowhere to go"


def test_explore_resamples_with_its_probability_and_is_reproducible() -> None:
    p = PBTConfig(resample_probability=1.0)
    params = {"optim.lr": 0.01, "optim.momentum": 0.5, "loss.label_smoothing": 0.1}
    draws = [pbt.explore(params, DIMS, p, random.Random(s)) for s in range(30)]
    assert all(
        1e-4 <= d["optim.lr"] <= 0.1 and d["optim.momentum"] in (0.0, 0.5, 0.9) for d in draws
    )
    assert len({d["optim.lr"] for d in draws}) == 30
    assert pbt.explore(params, DIMS, p, pbt.rng_for(0, 3, 128)) == pbt.explore(
        params, DIMS, p, pbt.rng_for(0, 3, 128)
    ), "the same sweep seed, trial and step draw the same values"


def test_a_timeline_follows_each_copy_to_the_donor_as_it_was_then() -> None:
    """Trial 2 copied trial 1 at step 200 (t=20); trial 1 had copied trial 0 at step 100 (t=10)
    and later, at t=30, trial 3: trial 2's weights came from 0 -> 1 (at 100) -> 2 (at 200)."""
    initial = {n: {"optim.lr": 0.1 * (n + 1)} for n in range(4)}
    lineages = {
        1: [
            {"step": 100, "from_trial": 0, "params": {"optim.lr": 0.05}, "time": 10},
            {"step": 300, "from_trial": 3, "params": {"optim.lr": 0.07}, "time": 30},
        ],
        2: [{"step": 200, "from_trial": 1, "params": {"optim.lr": 0.02}, "time": 20}],
    }
    assert pbt.timeline(2, initial, lineages) == [
        (0, {"optim.lr": 0.1}),
        (100, {"optim.lr": 0.05}),
        (200, {"optim.lr": 0.02}),
    ]
    assert pbt.timeline(1, initial, lineages) == [(0, {"optim.lr": 0.4}), (300, {"optim.lr": 0.07})]
    assert pbt.timeline(3, initial, lineages) == [(0, {"optim.lr": 0.4})]
    assert pbt.entry(200, {"optim.lr": 0.02, "loss.label_smoothing": 0.1}) == {
        "step": 200,
        "optim": {"lr": 0.02},
        "loss": {"label_smoothing": 0.1},
    }


@pytest.mark.parametrize(
    ("keys", "extra", "says"),
    [
        (["model.hidden"], [], "cannot mutate model.hidden"),
        (["optim"], [], "cannot mutate optim"),
        (["optim.name"], [], "cannot mutate optim.name"),
        (["optim.lr"], ["sched.name=cosine"], "sched=cosine sets too"),
        (["optim.lr"], ["sweep.pruner=asha"], "sweep.pruner=asha"),
        (["optim.lr"], ["launcher=slurm", "launcher.nodes=2"], "runs each trial as one task"),
        (["optim.lr"], ["sweep.pbt.quantile=0.75"], "must not overlap"),
        (["optim.lr"], ["sweep.pbt.quantile=0"], "none would ever copy"),
        (["optim.lr"], ["sweep.pbt.factors=[]"], "needs at least one factor"),
        ([], [], "needs a search space"),
    ],
)
def test_what_pbt_cannot_do_is_refused_before_the_sweep(
    keys: list[str], extra: list[str], says: str
) -> None:
    cfg = compose.compose(
        None, ["data=synthetic", "sched.name=null", "sweep.scheduler=pbt", *extra]
    )
    with pytest.raises(UserError) as e:
        pbt.check(cfg, keys, 1)
    assert says in str(e.value)
    if not keys or extra:
        return
    with pytest.raises(UserError, match="--repeat 2"):
        pbt.check(cfg, ["optim.lr"], 2)


# ---------------------------------------------------------------------------------------------
# a copy, on real checkpoint files
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_copy_makes_the_donors_checkpoint_its_own_bitwise_and_goes_on_with_new_values(
    tiny: Path,
) -> None:
    """Trial B continues from A's newest checkpoint: B's checkpoint is A's state exactly (models,
    optimizer, RNG, position), B's own metrics history stays, and B's next run starts at A's
    step with the new learning rate in force (train.hparam_schedule)."""
    import torch

    from expctl.config.schema import CheckpointConfig
    from expctl.rank import checkpoint, retention

    a, b = tiny.parent / "a", tiny.parent / "b"
    run_cli("run", "-C", str(tiny), f"run.dir={a}", "train.max_epochs=2", cwd=tiny.parent)
    run_cli(
        "run",
        "-C",
        str(tiny),
        f"run.dir={b}",
        "optim.lr=0.01",
        "train.max_epochs=1",
        cwd=tiny.parent,
    )
    rows_b = (b / "metrics.jsonl").read_text()
    # the weights compared or none: a step A kept, one it pruned (or never wrote)
    kept = pbt.freeze(a, b, 16)
    assert kept is not None and kept.name == "from_a_step_000000016.pt"
    kept.unlink()
    assert pbt.freeze(a, b, 8) is None
    frozen = pbt.freeze(a, b)
    assert frozen is not None and frozen.name == "from_a_step_000000032.pt"
    assert exploit.transplant(b, frozen, CheckpointConfig()) == 32 and frozen.exists()
    step = exploit.transplant(b, frozen, CheckpointConfig())  # a copy cut short, done again
    assert step == 32 and [p.name for p in retention.list_checkpoints(b)] == ["step_000000032.pt"]
    mine, theirs = (
        checkpoint.load(b / "checkpoints" / "step_000000032.pt"),
        checkpoint.load(retention.list_checkpoints(a)[0]),
    )
    for part in ("models", "optimizers"):
        for name, sd in theirs[part].items():
            flat_a, flat_b = _tensors(sd), _tensors(mine[part][name])
            assert flat_a.keys() == flat_b.keys() and all(
                torch.equal(flat_a[k], flat_b[k]) for k in flat_a
            )
    rng_a, rng_b = _tensors(theirs["rng"]), _tensors(mine["rng"])
    assert rng_a.keys() == rng_b.keys() and all(torch.equal(rng_a[k], rng_b[k]) for k in rng_a)
    assert (mine["step"], mine["epoch"], mine["batch"]) == (32, 2, 0)
    assert mine["metrics_rows"] == len(rows_b.splitlines()), "B's history is kept"
    assert frozen.exists(), "the donor's frozen state stays until the copy is recorded"
    from expctl.config import frozen as config

    frozen_cfg = config.load(b)  # what the sweep writes for a copy: its new values from the step
    train = dataclasses.replace(
        frozen_cfg.train, max_epochs=3, hparam_schedule=[{"step": 32, "optim": {"lr": 0.02}}]
    )
    (b / "config.yaml").write_text(config.to_yaml(dataclasses.replace(frozen_cfg, train=train)))
    go_on = run_cli("run", "-C", str(b / "config.yaml"), f"run.dir={b}", cwd=tiny.parent)
    assert "resumed from" in go_on.stdout and "(step 32, end of epoch 2" in go_on.stdout
    lrs = [json.loads(x).get("lr") for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert lrs[: len(rows_b.splitlines())] == [json.loads(x).get("lr") for x in rows_b.splitlines()]
    assert [lr for lr in lrs[len(rows_b.splitlines()) :] if lr is not None] == [0.02] * 4


def _tensors(sd: object, prefix: str = "") -> dict[str, object]:
    import torch

    out: dict[str, object] = {}
    if isinstance(sd, dict):
        for k, v in sd.items():
            out.update(_tensors(v, f"{prefix}{k}/"))
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            out.update(_tensors(v, f"{prefix}{i}/"))
    else:
        out[prefix] = (
            sd
            if isinstance(sd, torch.Tensor)
            else torch.tensor(float(sd) if isinstance(sd, (int, float)) else 0.0)
        )
    return out


# ---------------------------------------------------------------------------------------------
# a population on the CPU
# ---------------------------------------------------------------------------------------------

TOY = """\
model: {name: linear}
data: {name: synthetic, task: regression, shape: [16], num_classes: 1, num_samples: 256, val_samples: 256, batch_size: 16, noise: 1.0}
optim: {name: sgd, lr: 0.01}
sched: {name: null}
loss: {name: mse}
train: {max_epochs: 6, log_every: 8}
checkpoint: {keep: 2}
sweep: {metric: val/loss, mode: min}
"""


@pytest.mark.slow
def test_a_population_copies_records_its_lineage_and_best_yml_replays_the_best_trial(
    tmp_path: Path,
) -> None:
    (tmp_path / "toy.yml").write_text(TOY)
    proc = run_cli(
        "run",
        "-C",
        "toy.yml",
        "-m",
        "sweep.scheduler=pbt",
        "sweep.n_trials=4",
        "sweep.max_concurrent=4",
        "sweep.pbt.quantile=0.5",
        "sweep.pbt.resample_probability=0",
        "sweep.seed=1",
        "optim.lr=tag(log, interval(0.001, 0.1))",
        cwd=tmp_path,
        env=cli_env(),
    )
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    table = json.loads(run_cli("sweep", "table", "--json", str(sweep), cwd=tmp_path).stdout)
    trials = table["trials"]
    assert len(trials) == 4 and all(t["status"] == "completed" for t in trials)
    copies = [(t["trial"], e) for t in trials for e in t["lineage"]]
    by = {t["trial"]: t for t in trials}
    assert copies, "with half the population in the bottom quantile, someone copied"
    for n, e in copies:
        assert set(e) == {"step", "from_trial", "params", "time", "row"} and e["from_trial"] != n
        assert isinstance(e["row"], int) and e["row"] >= 0, "the metrics row where the copy began"
        assert 0.001 <= e["params"]["optim.lr"] <= 0.1
        # explored from the donor's value then (Ray Tune's PBT), not from its own
        donor = by[e["from_trial"]]
        values = [float(donor["params"]["optim.lr"])]
        values += [x["params"]["optim.lr"] for x in donor["lineage"] if x["time"] < e["time"]]
        lr = e["params"]["optim.lr"]
        assert any(
            lr == pytest.approx(min(0.1, max(0.001, v * f)))
            for v in values[-2:]  # its copy in flight: the values before it, or after
            for f in (0.8, 1.2)
        ), (lr, values)
        assert (
            f"continuing from trial {e['from_trial']}'s checkpoint of step {e['step']}"
            in (sweep / f"trial_{n:03d}" / "output.log").read_text()
        )
    _each_copy_is_of_the_step_compared_when_compared(sweep, trials)  # 16 steps an epoch too
    for t in trials:  # wall time from its start, not from its last copy's
        trained = json.loads((Path(t["run_dir"]) / "result.json").read_text())["time/train_s"]
        assert t["wall_s"] >= trained, (t["trial"], t["wall_s"], trained)
    _the_plot_draws_each_segment_from_where_its_weights_began(sweep, tmp_path, copies)
    best = run_cli("sweep", "best", str(sweep), cwd=tmp_path).stdout
    number = int(re.search(r"best trial (\d+):", best).group(1))  # type: ignore[union-attr]
    top = next(t for t in trials if t["trial"] == number)
    if top["lineage"]:
        assert "hparam_schedule:" in (sweep / "best.yml").read_text()
    replay = run_cli("run", "-C", str(sweep / "best.yml"), "run.dir=replay", cwd=tmp_path)
    result = json.loads((tmp_path / "replay" / "result.json").read_text())
    expected = json.loads((Path(top["run_dir"]) / "result.json").read_text())["val/loss"]
    assert result["val/loss"] == expected, f"{result['val/loss']} != {expected}: {replay.stdout}"


@pytest.mark.parametrize(
    ("space", "points"),
    [
        (["optim.lr=0.001,0.01,0.1"], [{"optim.lr": v} for v in ("0.001", "0.01", "0.1")]),
        (["optim.lr=tag(log, interval(0.001, 0.1))"], []),  # drawn: sweep.n_trials of them
    ],
)
def test_a_population_of_lists_is_the_grid_as_written(space: list[str], points: list) -> None:
    from expctl.sweep import plan as sweep

    plan = sweep.plan(None, ["data=synthetic", "sched=none", "sweep.scheduler=pbt", *space], [])
    assert plan.points == points


@pytest.mark.slow
def test_a_trial_ahead_of_the_others_is_compared_where_they_caught_up(tiny: Path) -> None:
    """The poor learning rate trains at twice the speed of the good one (the good one sleeps
    longer per step): it reaches every epoch first, alone there. It is still compared, at the
    newest epoch the other has reached, and continues as a copy of the better trial (it was
    never compared at all when only trials at its own epoch counted)."""
    proc = run_cli(
        "run",
        "-C",
        str(tiny),
        "-m",
        "imports=[faulty]",
        "train.step=slow",
        # 6 epochs: the fast trial trains ~7.7 s, the slow one reports its first epoch after
        # ~2.6 s; at 4 epochs (5.1 s) a CI run's start-up lag let the fast trial end before the
        # slow one had reported anything, and it was never compared
        "train.max_epochs=6",
        "sweep.scheduler=pbt",
        "sweep.pbt.quantile=0.5",
        "sweep.pbt.resample_probability=0",
        "optim.lr=0.0001,0.1",
        cwd=tiny.parent,
        # sleeps that outweigh a loaded machine's compute (at 0.03 s, 2 busy cores evened the
        # two trials' speeds in a CI run, and the fast one was never alone ahead)
        env=cli_env(SLOW_STEP_S="0.08", SLOW_LR_ABOVE="0.01"),
    )
    sweep = Path(re.search(r"sweep directory (\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    table = json.loads(run_cli("sweep", "table", "--json", str(sweep), cwd=tiny.parent).stdout)
    slow_good, fast_poor = (next(t for t in table["trials"] if t["trial"] == n) for n in (1, 0))
    assert [e["from_trial"] for e in fast_poor["lineage"]][:1] == [1], table["trials"]
    assert slow_good["lineage"] == [], "the better trial never copies"
    _each_copy_is_of_the_step_compared_when_compared(sweep, table["trials"])


def _the_plot_draws_each_segment_from_where_its_weights_began(
    sweep: Path, cwd: Path, copies: list[tuple[int, dict]]
) -> None:
    """plot_pbt.png: each trial's values as a line from step 0, then from each copy's step (a
    segment of one validation was a dot, or nothing); Optuna's views of the first values are
    skipped, saying why."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from expctl.sweep import ledger, plots

    said = run_cli("sweep", "plot", str(sweep), cwd=cwd).stdout
    assert (sweep / "plot_pbt.png").is_file(), said
    assert "skipped plot_slice: PBT changes each trial's values as it trains" in said, said
    fig = plots.pbt_figure(plt, ledger.settings(sweep), ledger.rows(sweep))
    lines = [line.get_xdata() for line in fig.axes[1].lines]
    assert all(x[0] < x[-1] for x in lines), lines
    assert sorted(int(x[0]) for x in lines) == sorted([0] * 4 + [e["step"] for _, e in copies])
    plt.close(fig)


def _each_copy_is_of_the_step_compared_when_compared(sweep: Path, trials: list[dict]) -> None:
    """Each copy took the donor's checkpoint of the epoch compared (not the one before: the
    score was told before its checkpoint was written), and was decided at the epoch the copying
    trial had just validated (not an epoch later: a trial ahead waits for the ones behind)."""
    for t in trials:
        rows = (sweep / f"trial_{t['trial']:03d}" / "metrics.jsonl").read_text().splitlines()
        log = (sweep / f"trial_{t['trial']:03d}" / "train.log").read_text()
        compared = [
            int(e) for e in re.findall(r"in the bottom \S+ of \d+ trials at epoch (\d+)", log)
        ]
        assert len(compared) == len(t["lineage"]), (compared, t["lineage"])
        for epoch, e in zip(compared, t["lineage"], strict=True):
            assert e["step"] == 16 * epoch, (e, epoch)  # 16 steps an epoch
            validated = [json.loads(r) for r in rows[: e["row"]] if '"val/' in r]
            assert validated[-1]["epoch"] == epoch, (validated[-1], e)


def test_a_copy_cut_short_by_a_killed_driver_is_finished_by_resume(tmp_path: Path) -> None:
    """The driver dies (SIGKILL) once a trial has made the donor's checkpoint its own but before
    the copy is recorded: `sweep resume` finishes the copy (explored values, lineage, the frozen
    state gone) instead of resuming the donor's weights under the trial's old values."""
    from expctl.sweep import ledger

    (tmp_path / "toy.yml").write_text(TOY)
    args = ["sweep.scheduler=pbt", "sweep.n_trials=4", "sweep.max_concurrent=4"]
    killed = run_cli(
        "run",
        "-C",
        "toy.yml",
        "-m",
        *args,
        "sweep.pbt.quantile=0.5",
        "sweep.seed=1",
        "optim.lr=tag(log, interval(0.001, 0.1))",
        "imports=[faulty]",
        "train.step=kill_driver_after_transplant",
        cwd=tmp_path,
        env=cli_env(KILL_AFTER_TRANSPLANT="1"),
        check=False,
    )
    assert killed.returncode == -9, killed.stdout + killed.stderr
    sweep = Path(re.search(r"sweep directory (\S+)", killed.stdout).group(1))  # type: ignore[union-attr]
    # copies recorded as decided ("copying"); a trial killed after linking the donor's checkpoint
    # but before recording its decision (another, at that moment) continues as itself
    from expctl.jobs.study import TrialRef, attrs_of

    def copying(trial: Path) -> bool:
        ref = TrialRef.read(trial)
        return ref is not None and attrs_of(ref).get("status") == "copying"

    cut = [p for p in sorted(sweep.glob("trial_*")) if copying(p)]
    assert cut, "a trial was copying"
    run_cli("sweep", "resume", str(sweep), cwd=tmp_path)
    rows = {Path(r.run_dir).name: r for r in ledger.rows(sweep)}
    assert all(r.status == "completed" for r in rows.values())
    for trial in cut:
        lineage = rows[trial.name].lineage
        assert lineage and not list(trial.glob("pbt/*.pt")), (trial.name, lineage)
        (entry,) = compose.compose(str(trial / "config.yaml"), []).train.hparam_schedule
        last = lineage[-1]
        assert entry == {"step": last["step"], "optim": {"lr": last["params"]["optim.lr"]}}


def test_a_population_that_stops_before_any_round_is_told_so(tiny: Path) -> None:
    """train.max_steps ends the trials before the first round's epoch (which the driver cannot
    know before the data is read): the sweep ends as a plain grid and says why, once."""
    proc = run_cli(
        "run", "-C", str(tiny), "-m", "sweep.scheduler=pbt", "optim.lr=0.01,0.1",
        "train.max_steps=20", "train.max_epochs=null", "sweep.pbt.interval=3", cwd=tiny.parent,
    )  # fmt: skip
    assert proc.stderr.count("note: no PBT round took place: sweep.pbt.interval=3") == 1, proc
    assert "they trained 2 at most (train.max_steps)" in proc.stderr, proc.stderr
    longer = run_cli(
        "run", "-C", str(tiny), "-m", "sweep.scheduler=pbt", "optim.lr=0.01,0.1",
        "train.max_epochs=2", "sweep.pbt.interval=1", cwd=tiny.parent,
    )  # fmt: skip
    assert "no PBT round" not in longer.stderr, longer.stderr
