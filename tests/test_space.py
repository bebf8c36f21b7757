"""The search space of `-m` against Hydra 1.3's own BasicSweeper on the same strings: the same
trials, each with the same overrides, in the same order (issue 24: float ranges, repeated keys,
sweep.params against the command line, shuffle); and the precedence of a swept key (trap 9)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import TINY
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from expctl.config import compose
from expctl.config.explain import parse_override
from expctl.errors import UserError
from expctl.sweep import plan as sweep
from expctl.sweep import space

# what glob() picks from, for both: config group -> its options, sorted (as Hydra lists them)
OPTIONS = {"model": ["cnn", "linear", "mlp", "resnet18"], "experiment": ["debug", "default"]}


class _Groups:
    """The one part of Hydra's ConfigLoader that its sweeper asks for glob()."""

    def get_group_options(self, group_name: str, results_filter: Any = None) -> list[str]:
        return OPTIONS.get(group_name, [])


def hydra_jobs(
    overrides: list[str], params: dict[str, str] | None = None, seed: int = 0
) -> list[list[str]]:
    """The jobs Hydra's BasicSweeper launches for `params` (hydra.sweeper.params) + `overrides`,
    as its sweep() computes them; shuffle() draws from `random`, seeded here."""
    # imported here: Hydra's plugin discovery (run by a composition in an earlier test) executes
    # its plugin modules again, and a class imported before would not be its module's own
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    random.seed(seed)
    parser = OverridesParser.create(config_loader=_Groups())  # type: ignore[arg-type]
    sweeper = BasicSweeper(max_batch_size=None, params=params)
    args = [*sweeper._parse_config(), *overrides]
    (jobs,) = BasicSweeper.split_arguments(parser.parse_overrides(args), None)
    return [sorted(job) for job in jobs]


def expctl_jobs(
    overrides: list[str], params: dict[str, str] | None = None, seed: int = 0
) -> list[list[str]]:
    """The trials expctl's grid runs for the same strings: each one's overrides."""
    plain, dims = space.parse_space(overrides, params, seed, options=OPTIONS.get)
    return [sorted([*plain, *(f"{k}={v}" for k, v in p.items())]) for p in space.grid(dims)]


CASES = [
    # ints, floats, negative and fractional steps (Hydra steps floats in decimal)
    ["a=1,2,3"],
    ["a=range(5)"],
    ["a=range(1,10,3)"],
    ["a=range(10,0,-3)"],
    ["a=range(-1,1,0.5)"],
    ["optim.lr=range(0,1,0.1)"],
    ["optim.lr=range(0.5,0,-0.1)"],
    ["a=range(1,2,0.25)"],
    ["a=range(0,1,0.3)"],
    ["a=range(1.5)"],
    ["a=range(0,3,1.0)"],
    ["a=float(range(1,3))"],
    ["a=1e-3,1e-2,-1,-2.5"],
    ["a=1_000,inf,-inf,null,true,str"],
    # choice, sort, tags, casts
    ["a=choice(1,2)"],
    ["a=sort(3,1,2)"],
    ["a=sort(3,1,2,reverse=true)"],
    ["a=tag(log,choice(0.1,0.01))"],
    ["a=str(1),int(2.5)"],
    # nested lists, dicts, quoted strings, escapes, interpolations
    ["a=choice([1,2],[3])"],
    ["a=[1,2],[3,4]", "b=[5, 6]"],
    ["a={x: 1},{x: 2}", "b={y: [1, 2]}"],
    ["a='x y',z"],
    ["a='p,q',r", 'b="it\'s",c'],
    ["a=x\\ y,z"],
    ["a=${b},c"],
    ["a='${oc.env:X,y}',z"],
    # a key given twice: its first place, its last value
    ["optim.lr=0.1,0.2", "optim.lr=0.3"],
    ["optim.lr=0.1,0.2", "optim.lr=0.3,0.4"],
    ["a=1,2", "b=3,4", "a=5,6"],
    ["a=3", "b=x,y", "a=1,2"],
    ["a=1", "b=2", "a=3"],
    # glob over a config group
    ["model=glob(*)"],
    ["model=glob([c*,m*],exclude=mlp)", "a=1,2"],
    ["experiment=glob(*)", "model=mlp"],
    # mixes
    ["optim.lr=0.1,0.2", "model.hidden=[8],[16,16]", "train.seed=range(2)"],
    ["a=range(3)", "b=choice(x,y)", "c=1", "d=[1,2],[3]", "+e=1,2"],
]


@pytest.mark.parametrize("overrides", CASES, ids=" ".join)
def test_the_grid_runs_what_hydras_sweeper_runs(overrides: list[str]) -> None:
    assert expctl_jobs(overrides) == hydra_jobs(overrides)


SHUFFLED = [
    ["a=shuffle(1,2,3,4,5,6)"],
    ["a=shuffle(range(8))", "b=shuffle(x,y,z)"],
    ["a=shuffle([1,2,3,4])", "b=1,2"],  # a plain list shuffled once, as Hydra does
    ["a=shuffle(1,2,3)", "b=5,6", "a=shuffle(4,5,6,7)"],
]


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("overrides", SHUFFLED, ids=" ".join)
def test_shuffle_draws_from_the_sweeps_seed_as_hydra_draws_from_random(
    overrides: list[str], seed: int
) -> None:
    state = random.getstate()
    ours = expctl_jobs(overrides, seed=seed)
    assert random.getstate() == state, "the process's random state is left alone"
    assert ours == hydra_jobs(overrides, seed=seed) == expctl_jobs(overrides, seed=seed)


def test_shuffle_changes_the_order_with_the_seed() -> None:
    orders = {tuple(map(tuple, expctl_jobs(["a=shuffle(range(8))"], seed=s))) for s in range(4)}
    assert len(orders) > 1
    assert sorted(orders.pop()) == sorted(map(tuple, expctl_jobs(["a=range(8)"])))


PARAMS = [
    # issue 24: sweep.params in the file must not beat the command line
    ({"optim.lr": "0.1"}, ["optim.lr=0.5", "train.seed=1,2"]),
    ({"a": "1,2"}, ["a=3"]),
    ({"a": "1,2"}, ["a=3,4"]),
    ({"a": "1,2"}, ["b=3,4"]),  # the file's key comes first: it varies slowest
    ({"a": "0.1", "b": "x,y"}, ["c=1,2", "a=0.5,0.6"]),
    ({"a": "shuffle(1,2,3)"}, ["b=shuffle(4,5,6)"]),
]


@pytest.mark.parametrize(("params", "overrides"), PARAMS, ids=str)
def test_sweep_params_come_first_and_the_command_line_wins(
    params: dict[str, str], overrides: list[str]
) -> None:
    assert expctl_jobs(overrides, params, seed=3) == hydra_jobs(overrides, params, seed=3)


@pytest.mark.parametrize(
    "text", ["a=range(1,5,0)", "a=range(0,1,0.0)", "a=range(-1,1,-0.0)", "a=shuffle(range(2,4,0))"]
)
def test_a_range_with_step_0_is_an_error_as_in_hydra(text: str) -> None:
    with pytest.raises((ValueError, HydraException)):
        hydra_jobs([text])
    with pytest.raises(UserError, match=r"range\(\) needs a step other than 0"):
        expctl_jobs([text])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a=range(0,inf,1)", "needs finite numbers"),  # Hydra's iterator never ends
        ("a=range(-inf,0)", "needs finite numbers"),
        ("a=range(nan,1,1)", "needs finite numbers"),  # Hydra: decimal.InvalidOperation
        ("a=range(0,1,nan)", "needs finite numbers"),
        ("a=range(0,1e9)", "more than 100,000"),
        ("a=range(0,1,1e-7)", "more than 100,000"),
    ],
)
def test_a_range_that_never_ends_or_is_huge_is_an_error(text: str, error: str) -> None:
    with pytest.raises(UserError, match=error):
        expctl_jobs([text])


@pytest.mark.parametrize("text", ["a=range(3,1)", "a=range(0,1,-0.5)", "model=glob(z*)"])
def test_an_empty_dimension_is_an_error_where_hydra_runs_nothing(text: str) -> None:
    assert hydra_jobs([text, "b=1,2"]) == []
    _, dims = space.parse_space([text, "b=1,2"], options=OPTIONS.get)
    with pytest.raises(UserError, match="gives it no value"):
        space.check_values(dims)


def test_glob_outside_a_config_group_is_an_error() -> None:
    with pytest.raises(UserError, match="'optim.lr' is not one"):
        space.parse_space(["optim.lr=glob(*)"], options=OPTIONS.get)


def test_a_key_with_and_without_plus_is_one_key_the_last_wins() -> None:
    """Hydra keys its sweeps by `+a` and `a` apart and runs two trials that both end with a=3
    (trap 9: one setting under many labels); expctl sets a key once, the last value winning."""
    assert hydra_jobs(["+a=1,2", "a=3"]) == [["+a=1", "a=3"], ["+a=2", "a=3"]]
    assert expctl_jobs(["+a=1,2", "a=3"]) == [["a=3"]]


@pytest.mark.parametrize("text", ["=1", "=1.5", "=true", "=null", "=1,2", "+=x", "=abc"])
def test_an_override_without_a_key_is_a_user_error(text: str) -> None:
    (o,) = OverridesParser.create().parse_overrides([text])  # Hydra's parser accepts it ...
    assert o.key_or_group == ""
    with pytest.raises(UserError, match="has no key"):  # ... and fails later, in composition
        parse_override(text)


# ---------------------------------------------------------------------------------------------
# precedence of a swept key (trap 9): defaults < config file < command line, as a matrix
# ---------------------------------------------------------------------------------------------

BODY = {None: "", "0.2": "optim: {lr: 0.2}\n"}
FILE_PARAMS = {None: "", "0.3": "sweep: {params: {optim.lr: '0.3'}}\n"}
COMMAND_LINE = [[], ["optim.lr=0.5"], ["optim.lr=0.5,0.6"]]


@pytest.mark.parametrize("cli", COMMAND_LINE, ids=lambda c: " ".join(c) or "-")
@pytest.mark.parametrize("params", FILE_PARAMS, ids=str)
@pytest.mark.parametrize("body", BODY, ids=str)
def test_precedence_of_a_swept_key(
    tmp_path: Path, body: str | None, params: str | None, cli: list[str]
) -> None:
    f = tmp_path / "exp.yml"
    f.write_text(BODY[body] + FILE_PARAMS[params] + "train: {max_epochs: 1}\n")
    want = cli[0].split("=")[1] if cli else params or body or "0.05"  # conf/config.yaml's lr
    planned = sweep.plan(str(f), cli, [])
    # a trial composes plain + its point over the file; composition's own precedence (the
    # command line beats the file) is tests/test_config.py's
    trials = [
        dict(o.split("=", 1) for o in [*planned.plain, *(f"{k}={v}" for k, v in p.items())])
        for p in planned.points
    ]
    lrs = [float(t.get("optim.lr", planned.base.optim.args["lr"])) for t in trials]
    assert lrs == [float(x) for x in want.split(",")]
    assert lrs[0] == planned.base.optim.args["lr"]


# ---------------------------------------------------------------------------------------------
# `_self_` in a -C file's defaults list: where it stands decides, as in Hydra's composition
# ---------------------------------------------------------------------------------------------

SELF = {
    "first": "defaults: [_self_, {optim: fast}]\noptim: {lr: 0.5, momentum: 0.3}\n",
    "last": "defaults: [{optim: fast}, _self_]\noptim: {lr: 0.5, momentum: 0.3}\n",
    "absent": "defaults: [{optim: fast}]\noptim: {lr: 0.5, momentum: 0.3}\n",
    "between": "defaults: [{optim: slow}, _self_, {loss: smooth}]\noptim: {lr: 0.5}\n"
    "loss: {label_smoothing: 0.3}\n",
    "alone": "defaults: [_self_]\noptim: {lr: 0.5, momentum: 0.3}\n",
}


@pytest.mark.filterwarnings("ignore:In 'exp'. Defaults list is missing `_self_`")
@pytest.mark.parametrize("where", SELF)
def test_self_in_the_defaults_list_places_the_files_own_settings_as_hydra_does(
    tmp_path: Path, where: str
) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    (tmp_path / "optim").mkdir()
    (tmp_path / "optim" / "fast.yaml").write_text("name: sgd\nlr: 0.01\n")
    (tmp_path / "optim" / "slow.yaml").write_text("name: sgd\nlr: 0.001\nmomentum: 0.7\n")
    (tmp_path / "loss").mkdir()
    (tmp_path / "loss" / "smooth.yaml").write_text("name: cross_entropy\nlabel_smoothing: 0.1\n")
    f = tmp_path / "exp.yaml"  # .yaml: Hydra's own search path finds no .yml
    f.write_text(SELF[where])
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        ref = hydra_compose(config_name="exp")
    cfg = compose.compose(str(f))
    assert (cfg.optim.args["lr"], cfg.optim.args["momentum"]) == (ref.optim.lr, ref.optim.momentum)
    if "loss" in ref:
        assert cfg.loss.args["label_smoothing"] == ref.loss.label_smoothing


def test_an_experiment_after_self_beats_the_files_own_settings(tmp_path: Path) -> None:
    f = tmp_path / "exp.yml"
    f.write_text("defaults: [_self_, {experiment: fashion_speedrun}]\ntrain: {max_epochs: 4}\n")
    assert compose.compose(str(f)).train.max_epochs == 10  # the preset's: it comes after
    f.write_text("defaults: [{experiment: fashion_speedrun}, _self_]\ntrain: {max_epochs: 4}\n")
    assert compose.compose(str(f)).train.max_epochs == 4


def test_self_twice_is_a_user_error(tmp_path: Path) -> None:
    f = tmp_path / "exp.yml"
    f.write_text("defaults: [_self_, {optim: adam}, _self_]\n")
    with pytest.raises(UserError, match="_self_ twice"):
        compose.compose(str(f))


# a sweep's point, as the trial's override of one key: set on Hydra's composition of the rest
POINTS = [
    "train.seed=7",
    "optim.lr=0.5",
    "optim.lr=1e-05",
    "model.hidden=[4,4]",
    "train.early_stop={monitor: val/loss, patience: 2}",  # a mapping merges, as in Hydra
    "train.seed=${train.max_epochs}",
    "run.name='a b'",
    "data.num_samples=${oc.env:EXPCTL_TEST_SAMPLES,64}",
    "train.max_steps=null",
    # bad ones: the same error either way
    "train.seed=abc",
    "train.sed=1",
    "optim.lr=-1",
    "train.early_stop={patience: x}",
    "data.num_samples=${nowhere}",
]


@pytest.mark.parametrize("point", POINTS)
def test_a_points_value_set_on_the_shared_composition_is_hydras_whole_composition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """compose(vary=...) has Hydra compose what a sweep's points share once, and sets each
    point's values on a copy: the Config (or the error) must be what Hydra's composition of all
    the overrides gives."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(compose, "_STEMS", {})
    (tmp_path / "tiny.yml").write_text(TINY)
    plain = ["train.max_epochs=2", "model.hidden=[8]"] if "hidden" not in point else []
    key = parse_override(point).key_or_group

    def outcome(vary: list[str]) -> Any:
        try:
            return compose.compose("tiny.yml", [*plain, point], vary=vary)
        except UserError as e:
            return (e.message, e.hint)

    whole = outcome([])
    assert compose._STEMS == {}
    calls: list[tuple[str, ...]] = []
    real = compose._compose_node
    monkeypatch.setattr(compose, "_compose_node", lambda f, o: calls.append(tuple(o)) or real(f, o))
    assert outcome([key]) == whole
    assert calls[0] == tuple(plain), "Hydra composed the shared overrides, not this point"
    if not isinstance(whole, tuple):
        assert len(calls) == 1, "the value was set on the shared composition"


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=linear"],  # a component: Hydra's defaults list changes
        ["optim.name=adam"],
        ["optim.lr=0.1", "optim.lr=0.2"],  # given twice: Hydra's order decides
        ["train.early_stop.patience=2", "train.early_stop={patience: 4}"],  # nested in another
        ["+train.seed=3"],
        ["experiment=debug"],
    ],
    ids=" ".join,
)
def test_what_a_point_cannot_set_on_the_shared_composition_hydra_composes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yml").write_text(TINY)
    vary = [parse_override(o).key_or_group.lstrip("+") for o in overrides]
    assert compose._plain_values(overrides, vary) == []
    assert compose.compose("tiny.yml", overrides, vary=vary) == compose.compose(
        "tiny.yml", overrides
    )
