"""`expctl runs` and `expctl diff` on real tiny runs (two runs and a two-trial sweep), damaged
run directories, the filters they share with `sweep table`, and start-up without torch."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SMALL, cli_env
from conftest import expctl as run_cli

import expctl
from expctl import cli, tables
from expctl.errors import UserError
from expctl.rank import rundir

BASE = ["run", *SMALL, "train.device=cpu", "sched=none", "train.max_steps=4"]
WIDE = cli_env(COLUMNS="400")  # every column fits: the tests read them all


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runs/a (optim.lr=0.1), runs/b (optim.lr=0.05, model.hidden=[16]) and a sweep over
    optim.lr=0.2,0.3 (runs/sweep-*/trial_000, trial_001): only optim.lr and model.hidden differ."""
    cwd = tmp_path_factory.mktemp("compare")
    run_cli(*BASE, "optim.lr=0.1", "run.dir=runs/a", cwd=cwd)
    run_cli(*BASE, "optim.lr=0.05", "model.hidden=[16]", "run.dir=runs/b", cwd=cwd)
    run_cli(*BASE, "-m", "optim.lr=0.2,0.3", cwd=cwd)
    return cwd


@pytest.mark.slow  # the fixture trains 4 tiny runs
def test_runs_lists_every_run_with_only_the_keys_that_differ(root: Path) -> None:
    out = run_cli("runs", cwd=root, env=WIDE).stdout
    lines = out.splitlines()
    assert lines[0] == "runs under runs  (4 run(s): 4 completed)", out
    header = lines[1].split()
    assert header[:2] == ["run", "status"] and header.index("best:val/acc") < header.index(
        "model.hidden"
    ) < header.index("optim.lr") < header.index("wall_s"), "the metrics first"
    assert {"val/acc", "train/loss", "best:val/acc", "wall_s", "started"} <= set(header)
    names = [line.split()[0] for line in lines[2:6]]
    assert names[:2] == ["a", "b"], "by start time"
    assert [n[:6] + n[-10:] for n in names[2:]] == ["sweep-/trial_000", "sweep-/trial_001"], (
        "sweep trials too, named by their path under the root (cut in the middle to fit)"
    )
    assert "optim.name" not in out, "keys every run shares are left out"
    assert lines[-1].startswith("the same in every run: ")


@pytest.mark.slow  # the fixture trains 4 tiny runs
def test_runs_as_json_and_csv_parse_back_sorted_and_filtered(root: Path) -> None:
    data = json.loads(run_cli("runs", "--json", cwd=root).stdout)
    by_name = {r["run"]: r for r in data["runs"]}
    assert by_name["a"]["optim.lr"] == 0.1 and by_name["b"]["model.hidden"] == [16]
    assert data["same"]["optim.name"] == "sgd" and "optim.lr" not in data["same"]
    for r in data["runs"]:  # each run's final metrics, as its result.json holds them
        final = json.loads((Path(r["path"]) / "result.json").read_text())
        assert r["status"] == "completed" and r["val/acc"] == final["val/acc"], r
    text = run_cli("runs", "runs", "--csv", "--sort=-optim.lr", cwd=root).stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [float(r["optim.lr"]) for r in rows] == [0.3, 0.2, 0.1, 0.05]
    assert rows[0]["model.hidden"] == "[8]" and Path(rows[0]["path"]).is_dir()
    picked = run_cli(
        "runs", "--csv", "--filter", "optim.lr<0.25", "--filter", "model.hidden=[8]", cwd=root
    ).stdout
    assert sorted(float(r["optim.lr"]) for r in csv.DictReader(io.StringIO(picked))) == [0.1, 0.2]
    two = run_cli("runs", "runs/a", "runs/b", "--csv", cwd=root).stdout
    assert [r["run"] for r in csv.DictReader(io.StringIO(two))] == ["runs/a", "runs/b"]
    none = json.loads(run_cli("runs", "--json", "--filter", "status=failed", cwd=root).stdout)
    assert none["runs"] == []
    shown = run_cli("runs", "--filter", "optim.lr!=0.1", "--sort", "optim.lr", cwd=root, env=WIDE)
    assert "(3 of 4 run(s): 3 completed)" in shown.stdout
    at = shown.stdout.splitlines()[1].split().index("optim.lr")
    assert [line.split()[at] for line in shown.stdout.splitlines()[2:5]] == ["0.05", "0.2", "0.3"]


@pytest.mark.slow  # the fixture trains 4 tiny runs
def test_diff_shows_changed_keys_and_metric_deltas(root: Path) -> None:
    out = run_cli("diff", "runs/a", "runs/b", cwd=root, env=WIDE).stdout
    a, b = (json.loads((root / "runs" / n / "result.json").read_text()) for n in "ab")
    assert out.startswith("A  runs/a  completed  wall ") and "\nB  runs/b  completed" in out
    assert "config: 2 key(s) differ" in out
    assert [line.split() for line in out.splitlines() if line.startswith("  model.hidden")] == [
        ["model.hidden", "[8]", "[16]"]
    ]
    assert any(line.split()[:3] == ["optim.lr", "0.1", "0.05"] for line in out.splitlines())
    (acc,) = [line.split() for line in out.splitlines() if line.startswith("  val/acc ")]
    assert acc[1:] == [
        f"{a['val/acc']:.4g}",
        f"{b['val/acc']:.4g}",
        f"{b['val/acc'] - a['val/acc']:+.4g}",
    ]
    assert "best:val/acc" in out


@pytest.mark.slow  # the fixture trains 4 tiny runs
def test_runs_in_python(root: Path) -> None:
    found = expctl.runs(root / "runs")
    assert len(found) == 4 and found.differing() == ["model.hidden", "optim.lr"]
    best = found.select(sort="-best:val/acc").rows[0]
    assert best.best["val/acc"] == max(r.best["val/acc"] for r in found)
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="needs pandas"):
            found.to_pandas()
    else:
        frame = found.to_pandas()
        assert sorted(frame["optim.lr"]) == [0.05, 0.1, 0.2, 0.3] and "a" in frame.index


@pytest.mark.slow  # the fixture trains 4 tiny runs
def test_runs_and_diff_read_only_and_import_neither_torch_nor_hydra_nor_optuna(
    root: Path,
) -> None:
    before = _files(root)
    code = (
        "import sys\nfrom expctl import cli\n"
        "assert cli.main(['runs', '--json', '--sort=-val/acc']) == 0\n"
        "assert cli.main(['diff', 'runs/a', 'runs/b']) == 0\n"
        "heavy = [m for m in ('torch', 'hydra', 'optuna') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=root, env=cli_env(), check=True, timeout=60)
    assert _files(root) == before, "nothing written, the run locks included"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*") if p.is_file()
    }


def test_damaged_and_partial_run_dirs_are_listed_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    for name in ("broken_config", "broken_result", "no_result", "bare", "good", "live"):
        _fake_run(runs / name, lr=0.1 if name != "good" else 0.2)
    (runs / "broken_config" / "config.yaml").write_text("model: {name: [\n")
    (runs / "broken_result" / "result.json").write_text('{"val/acc": 0.')
    (runs / "no_result" / "result.json").unlink()
    with open(runs / "no_result" / "metrics.jsonl", "a") as f:
        f.write("not json\n")
    for name in ("metrics.jsonl", "result.json"):
        (runs / "bare" / name).unlink()
    (runs / "live" / "result.json").unlink()
    monkeypatch.chdir(tmp_path)
    held = rundir.RunLock(runs / "live")  # a launch training it
    holder = (runs / "live" / ".lock").read_text()
    assert cli.main(["runs", "--csv"]) == 0
    assert (runs / "live" / ".lock").read_text() == holder, "the lock is read, not taken"
    held.release()
    out, err = capsys.readouterr()
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO(out))}
    assert {k: rows[k]["status"] for k in rows} == {
        "bare": "not started",
        "broken_config": "completed",
        "broken_result": "unfinished",
        "good": "completed",
        "live": "running",
        "no_result": "unfinished",
    }
    assert rows["no_result"]["val/acc"] == "0.5", "the last logged value stands in for the result"
    assert rows["good"]["best:val/acc"] == "0.75" and rows["good"]["wall_s"] == "3.5"
    assert "broken_config/config.yaml: not valid YAML" in err
    assert "cannot read" in err and "unreadable line" in err
    assert [k for k in rows["good"] if "." in k] == ["optim.lr"], (
        "the unreadable config does not make every key differ"
    )


def test_runs_shows_the_metrics_and_the_settings_that_matter_first_and_picks_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a user trial: with many settings differing, every metric was "not shown, too
    wide". The keys Adam's or SGD's choice brings (betas, momentum) come after those set
    differently (optim.name, lr); --columns picks columns, globs and any config key."""
    runs = tmp_path / "runs"
    for name, lr, optim in (("a", 0.1, "sgd"), ("b", 0.2, "sgd"), ("c", 0.1, "adam")):
        extra = "  momentum: 0.9\n" if optim == "sgd" else "  betas: [0.9, 0.99]\n"
        _fake_run(runs / name, lr, optim, extra + "train:\n  seed: 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["runs"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[1:6]
    shown = ["run", "status", "val/acc", "best:val/acc", "optim.name", "optim.lr", "wall_s"]
    assert header.split() == shown
    assert rows[-1].endswith("started, optim.momentum, optim.betas; --csv or --json show all)")
    assert cli.main(["runs", "--columns", "optim.*,val/acc", "--sort=-optim.lr"]) == 0
    header, first = capsys.readouterr().out.splitlines()[1:3]
    assert header.split() == ["run", "optim.name", "optim.lr", "optim.momentum"] + [
        "optim.betas",
        "val/acc",
    ]
    assert first.split()[:3] == ["b", "sgd", "0.2"]
    assert cli.main(["runs", "--csv", "--columns", "train.seed,wall_s"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["run,train.seed,wall_s", "a,1,3.5"]
    with pytest.raises(UserError, match="--columns val/acx: no such column. Did you mean"):
        expctl.runs(runs).pick(["val/acx"])


def test_runs_puts_a_key_that_splits_the_runs_as_another_does_after_the_telling_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a new user: a sweep of optim.lr beside other runs of another model and dataset
    showed model.name, data.name and run.name (model-data), and put the swept optim.lr under
    "not shown, too wide". data.name and run.name split the runs as model.name does: they come
    after the keys that tell something (run.* last)."""
    runs = tmp_path / "runs"
    for name, lr, model, data in (
        ("s0", 0.01, "mlp", "synthetic"),
        ("s1", 0.1, "mlp", "synthetic"),
        ("f0", 0.05, "cnn", "fashion_mnist"),
    ):
        more = f"model:\n  name: {model}\ndata:\n  name: {data}\nrun:\n  name: {model}-{data}\n"
        _fake_run(runs / name, lr, "sgd", more)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["runs"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()[1:6]
    assert header.split()[4:6] == ["model.name", "optim.lr"], header
    assert rows[-1].endswith("data.name, run.name; --csv or --json show all)"), rows


def test_runs_keeps_each_config_read_and_reads_a_changed_one_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing 77 frozen configs safely took seconds at every `expctl runs`: each is read once
    per version of the file."""
    runs, kept = tmp_path / "runs", tmp_path / "cache" / "configs"
    _fake_run(runs / "a", lr=0.1)
    monkeypatch.setenv("EXPCTL_CACHE_DIR", str(tmp_path / "cache"))
    assert expctl.runs(runs).rows[0].config["optim.lr"] == 0.1
    (copy,) = kept.iterdir()
    copy.write_text(json.dumps({"optim.lr": 0.7}))  # what is read next time: the kept copy
    assert expctl.runs(runs).rows[0].config["optim.lr"] == 0.7
    (runs / "a" / "config.yaml").write_text("optim:\n  name: sgd\n  lr: 0.3\n")
    assert expctl.runs(runs).rows[0].config == {"optim.name": "sgd", "optim.lr": 0.3}
    assert len(list(kept.iterdir())) == 1, "the copy of the old version is gone"


def _fake_run(path: Path, lr: float, optim: str = "sgd", more: str = "") -> None:
    """A run directory as a completed run leaves it: config, two validations, a result."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        f"optim:\n  name: {optim}\n  lr: {lr}\n{more}sweep:\n  metric: val/acc\n  mode: max\n"
    )
    events = [
        {"step": 2, "val/acc": 0.75, "time": 100.0},
        {"step": 4, "val/acc": 0.5, "time": 103.0},
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = {"val/acc": 0.5, "step": 4, "status": "completed", "time/train_s": 3.5}
    (path / "result.json").write_text(json.dumps(result))


def test_filters_compare_numbers_and_name_the_bad_ones() -> None:
    records = [
        {"k": 0.1, "s": "a"},
        {"k": 0.5, "s": "b"},
        {"k": None, "s": "a"},
        {"k": 2, "s": "c"},
    ]
    pick = lambda *f, sort=None: tables.select(records, sort, f, ["k", "s"], "x")  # noqa: E731
    assert pick("k>=0.5") == [1, 3] and pick("k<0.5") == [0] and pick("k!=0.1") == [1, 2, 3]
    assert pick("s=a", "s=c") == [0, 2, 3] and pick("s=a", "k>0") == [0]
    assert pick(sort="-k") == [3, 1, 0, 2], "missing values last"
    assert tables.Filter.parse("val/acc>=0.9") == tables.Filter("val/acc", ">=", "0.9")
    assert tables.Filter.parse("model.hidden=[8]").value == "[8]"
    for bad, message in [
        ("k", "expected KEY=VALUE"),
        ("k>high", "compares numbers"),
        ("kk=1", "Did you mean 'k'?"),
    ]:
        with pytest.raises(UserError, match=message):
            pick(bad)
