"""Readers of a run's and a sweep's files survive damage: `status` and `sweep table` show what
they can read and name the damaged file; a journal damaged beyond reading is one error, exit 2."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import conftest
import pytest

from expctl import cli

SMALL = [
    *conftest.SMALL,
    "train.max_steps=2",
]


def test_status_reads_around_damaged_lines_and_names_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", *SMALL, "run.dir=r"]) == 0
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write("garbage\n")
    (tmp_path / "r" / "jobs.jsonl").write_text(
        '{"job_id": "7", "event": "started", "restart": "x"}\n[1, 2]\n'
    )
    (tmp_path / "r" / "result.json").write_text("{broken")
    capsys.readouterr()
    assert cli.main(["status", "r"]) == 0
    out, err = capsys.readouterr()
    assert "progress  step 2" in out and "job       7" in out, out
    assert "metrics.jsonl: skipped 1 unreadable line(s)" in err
    assert "jobs.jsonl: skipped 1 unreadable line(s)" in err
    assert "cannot read" in err and "result.json" in err and "Traceback" not in err


@pytest.mark.slow
def test_sweep_table_reads_a_truncated_journal_and_refuses_a_corrupt_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "-m", *SMALL, "optim.lr=0.1,0.2"]) == 0
    sweep = Path(re.search(r"sweep directory (\S+)", capsys.readouterr().out).group(1))  # type: ignore[union-attr]
    journal = sweep / "journal.log"
    text = journal.read_bytes()
    journal.write_bytes(text[:-5])  # cut inside the last record
    assert cli.main(["sweep", "table", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert "last line is incomplete" in err and str(journal) in err
    rows = [line for line in out.splitlines() if re.match(r"\s*\d+\s+completed ", line)]
    assert len(rows) == 2, out
    assert cli.main(["sweep", "resume", str(sweep)]) == 0  # drops the torn record, appends after
    assert "dropped an incomplete last record" in capsys.readouterr().err
    assert cli.main(["sweep", "table", str(sweep)]) == 0
    capsys.readouterr()
    text = journal.read_bytes()
    (sweep / "trial_000" / "result.json").write_text(DEEP_MAPPING)  # issue 28
    spec = (sweep / "sweep.json").read_text()
    (sweep / "sweep.json").write_text('{"points": "x"}')
    journal.write_bytes(text + b"{not json\n")  # read past (being written): never appended to
    assert cli.main(["sweep", "table", str(sweep)]) == 0
    out, err = capsys.readouterr()
    assert len([line for line in out.splitlines() if re.match(r"\s*\d+\s+completed ", line)]) == 2
    assert "trial_000/result.json" in err and "sweep.json is damaged" in err, err
    (sweep / "sweep.json").write_text(spec)
    assert cli.main(["sweep", "resume", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert f"{journal} is damaged (JSONDecodeError" in err and "Traceback" not in err, err
    assert journal.read_bytes() == text + b"{not json\n", "nothing appended"
    lines = text.splitlines(keepends=True)
    journal.write_bytes(b"".join([*lines[:3], b"{not json\n", *lines[3:]]))
    assert cli.main(["sweep", "table", str(sweep)]) == 2
    err = capsys.readouterr().err
    assert f"{journal} is damaged" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 2


@pytest.mark.slow
def test_a_damaged_torchvision_signature_cache_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncated, emptied, edited by hand (checksum kept) or malformed: the composition is the
    one made from torchvision (no traceback, no model hidden), and the file is written again.
    A fresh process writes the cache; each damaged copy is then read where a process reads it,
    when torchvision's models register (here: torchvision stays imported, ~8 s a process)."""
    from expctl.builtin import tvmodels

    first = conftest.compose_resnet(tmp_path)
    (cache,) = tmp_path.glob("torchvision-*.json")
    good = json.loads(cache.read_text())
    edited = json.loads(cache.read_text())
    for param in edited["specs"]["models"]["resnet18"]["params"]:
        if param[0] == "groups":  # groups=1 -> 7
            param[2] = 7
    assert edited != good
    damaged = [
        '{"specs": {"models": ',
        json.dumps({**good, "specs": {"models": {}, "imported": []}}),
        json.dumps(edited),
        json.dumps({"specs": {"models": {"resnet18": {"params": "x"}}, "imported": []}}),
    ]
    monkeypatch.setenv("EXPCTL_CACHE_DIR", str(tmp_path))
    assert tvmodels._signature_cache() == cache
    try:
        for text in damaged:
            cache.write_text(text)
            tvmodels._register_torchvision()
            assert _compose_resnet() == [first[0], first[2]], text
            assert json.loads(cache.read_text()) == good, text
    finally:
        cache.write_text(json.dumps(good))
        tvmodels._register_torchvision()  # the next tests of this process see torchvision's


def _compose_resnet() -> list[str]:
    """conftest.COMPOSE_RESNET's first and third line, in this process."""
    from expctl.config import compose
    from expctl.errors import UserError

    args = str(compose.compose(None, ["model=resnet18", "model.name=resnet50"]).model.args)
    try:
        compose.compose(None, ["model=resnet18", "model.widht_per_group=3"])
    except UserError as e:
        return [args, e.message]
    return [args, "no error"]


# issue 28: what a damaged file can hold; each read-only command warns in one line, names the
# file, and shows the rest (the other run, the run's other files)
DEEP_LIST = "[" * 100_000 + "]" * 100_000
DEEP_MAPPING = '{"a": ' * 100_000 + "1" + "}" * 100_000
LONG_INT = '{"step": ' + "9" * 5000 + ', "epoch": 1}'  # over Python's 4300 digits
DAMAGED_RUN_FILES = [
    ("result.json", DEEP_LIST, "cannot read"),
    ("result.json", DEEP_MAPPING, "cannot read"),
    ("result.json", LONG_INT, "cannot read"),
    ("metrics.jsonl", DEEP_MAPPING + "\n", "skipped 1 unreadable line(s)"),
    ("metrics.jsonl", LONG_INT + "\n", "skipped 1 unreadable line(s)"),
    ("jobs.jsonl", DEEP_LIST + "\n", "skipped 1 unreadable line(s)"),
    ("provenance.json", DEEP_LIST, "cannot read"),
    ("provenance.json", '{"launches": {"a": 1}}', "does not hold a list of launches"),
    ("provenance.json", '{"launches": 5}', "does not hold a list of launches"),
]


@pytest.mark.parametrize(
    ("name", "text", "warning"),
    DAMAGED_RUN_FILES,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(DAMAGED_RUN_FILES)],
)
def test_a_damaged_file_is_a_warning_and_the_rest_still_shows(
    name: str, text: str, warning: str, tmp_path: Path
) -> None:
    """`status`, `runs` and `diff` as real CLI processes on runs/bad (one file damaged) beside
    runs/good: exit 0, one warning line naming the file, both runs listed."""
    for run in ("good", "bad"):
        _fake_run(tmp_path / "runs" / run)
    damaged = tmp_path / "runs" / "bad" / name
    with open(damaged, "a" if name.endswith(".jsonl") else "w") as f:  # a line among good ones
        f.write(text)
    commands = [["status", "runs/bad"], ["runs", "--csv"], ["diff", "runs/bad", "runs/good"]]
    readers = commands if name in ("result.json", "metrics.jsonl") else commands[:1]
    for args in readers:
        proc = conftest.expctl(*args, cwd=tmp_path, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert any(warning in line and str(damaged.name) in line for line in lines), proc.stderr
        assert all(line.startswith("expctl: warning: ") for line in lines), proc.stderr
        if args[0] == "runs":
            assert {"bad", "good"} <= {r["run"] for r in csv.DictReader(io.StringIO(proc.stdout))}
        if args[0] == "status":
            assert "run       " in proc.stdout and "progress  step 4" in proc.stdout, proc.stdout


def _fake_run(path: Path) -> None:
    """A run directory as a completed run leaves it (no training): config, metrics, result, a
    launch record, a Slurm job event."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("optim: {name: sgd, lr: 0.1}\nsweep: {metric: val/acc}\n")
    events = [{"step": 2, "epoch": 0, "val/acc": 0.75}, {"step": 4, "epoch": 1, "val/acc": 0.5}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = {"val/acc": 0.5, "step": 4, "status": "completed", "time/train_s": 3.5}
    (path / "result.json").write_text(json.dumps(result))
    (path / "provenance.json").write_text(json.dumps({"launches": [{"attempts": [{}]}]}))
    (path / "jobs.jsonl").write_text('{"job_id": "7", "event": "started"}\n')
