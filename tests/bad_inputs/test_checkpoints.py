"""Checkpoints that cannot start a run: `checkpoint.resume=PATH` at another architecture, at a
file holding pickled code, at something that is not a checkpoint. Each is one or two lines, exit
2, no traceback, and no run directory left behind."""

from __future__ import annotations

import pickle
from pathlib import Path

import conftest
import pytest
import torch

from expctl import cli

TINY = [
    *conftest.SMALL,
    "train.max_steps=2",
    "train.device=cpu",
]


class Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pickled code ran",))


def _payload(models: dict[str, dict[str, torch.Tensor]]) -> dict[str, object]:
    return {"format": 1, "step": 3, "epoch": 0, "batch": 3, "models": models, "optimizers": {}}


def _write(folder: Path) -> None:
    wide = {"net.1.weight": torch.zeros(64, 6), "net.1.bias": torch.zeros(64)}
    torch.save(_payload({"model": wide}), folder / "wide.pt")
    torch.save(_payload({"generator": {}}), folder / "gan.pt")
    (folder / "evil.pt").write_bytes(pickle.dumps(_payload({"model": {"x": Evil()}})))  # type: ignore[dict-item]
    (folder / "text.pt").write_text("not a checkpoint\n")
    torch.save({"format": 99}, folder / "future.pt")


CASES = [
    ("wide.pt", "its model 'model' does not match"),
    ("gan.pt", "its model 'generator' is not part of this config"),
    ("evil.pt", "cannot read"),
    ("text.pt", "cannot read"),
    ("future.pt", "is not an expctl checkpoint of format 1"),
]


@pytest.mark.parametrize(("name", "expected"), CASES)
def test_an_unusable_checkpoint_is_a_short_error_and_leaves_no_run(
    name: str,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _write(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert cli.main(["run", *TINY, f"checkpoint.resume={tmp_path / name}"]) == 2
    out = capsys.readouterr()
    err = out.err
    assert expected in err and f"checkpoint.resume={tmp_path / name}" in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("expctl: error: "), err
    assert lines[1].startswith("  HINT: ") and "Traceback" not in err
    assert "pickled code ran" not in out.out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no run directory left"


@pytest.mark.slow  # a real process
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("plain.pkl", "not a torch.save file of tensors"),
        ("code.pt", "holds objects other than tensors and plain containers (Unsupported global"),
    ],
)
def test_checkpoint_init_at_a_plain_pickle_or_pickled_code_is_one_line_and_a_hint(
    name: str, expected: str, tmp_path: Path
) -> None:
    """In a real process: nothing of torch's warning about the pickle protocol, nor its advice
    to load the file with weights_only=False (which runs the code a file holds)."""
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"net.1.weight": [[0.0] * 6]}))
    torch.save({"net.1.weight": Evil()}, tmp_path / "code.pt")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = conftest.expctl("run", *TINY, f"checkpoint.init={name}", cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2 and expected in lines[0], proc.stderr
    assert lines[1].startswith("  HINT: ") and "weights_only" not in proc.stderr
    assert "pickled code ran" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no run directory left"


# --- a run's own checkpoints, damaged ----------------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _flip_digest(digest_file: Path) -> None:
    text = digest_file.read_text()
    digest_file.write_text(("0" if text[0] != "0" else "1") + text[1:])


@pytest.mark.slow  # trains
@pytest.mark.parametrize("damage", ["every-digest", "newest-weights"])
def test_a_run_whose_newest_checkpoint_fails_verification_is_refused_not_restarted(
    damage: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Re-running (or lengthening) a run whose newest checkpoint does not verify neither starts it
    over nor prunes anything: exit 2, the files untouched, the way on in the HINT."""
    monkeypatch.chdir(tmp_path)
    run = [*conftest.SMALL, "train.device=cpu", "sched=none", "checkpoint.every=2", "run.dir=r"]
    assert cli.main(["run", *run, "train.max_steps=8"]) == 0
    ckpts = tmp_path / "r" / "checkpoints"
    newest, older = ckpts / "step_000000008.pt", ckpts / "step_000000006.pt"
    if damage == "every-digest":  # the weights are intact: only a checksum proves it
        for digest in ckpts.glob("*.sha256"):
            _flip_digest(digest)
    else:
        newest.write_bytes(newest.read_bytes()[:-100])
    before = _tree(tmp_path / "r")
    capsys.readouterr()
    for steps in ("train.max_steps=8", "train.max_steps=16"):
        assert cli.main(["run", *run, steps]) == 2
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 2 and "Traceback" not in err, err
        assert lines[0] == (
            f"expctl: error: run.dir={tmp_path / 'r'}: its newest checkpoint does not load "
            f"(checksum mismatch for {newest}); the run is not started over"
        )
        if damage == "every-digest":
            assert "no older checkpoint of it is intact" in lines[1]
        else:
            assert f"move {newest}* elsewhere to continue from {older.name}" in lines[1]
        assert {k: v for k, v in _tree(tmp_path / "r").items() if k != "train.log"} == {
            k: v for k, v in before.items() if k != "train.log"
        }, "nothing pruned, nothing rewritten"
    if damage == "newest-weights":  # the HINT's way on
        (tmp_path / "aside").mkdir()
        for f in ckpts.glob(f"{newest.name}*"):
            f.rename(tmp_path / "aside" / f.name)
        assert cli.main(["run", *run, "train.max_steps=16"]) == 0
        assert f"resumed from {older} (step 6," in capsys.readouterr().out


def test_pruning_never_deletes_a_checkpoint_it_cannot_verify(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """keep=2: the checkpoint that falls out of the window is deleted only once its checksum
    proves it intact; one that fails stays, with a warning, until it is checked again."""
    from expctl.config.schema import CheckpointConfig
    from expctl.rank import checkpoint, retention

    ck = CheckpointConfig(keep=2)
    weights = {"model": {"w": torch.arange(4.0)}}

    def save(step: int) -> None:
        checkpoint.save(tmp_path, {"step": step, "epoch": 0, "models": weights}, ck, {})

    save(1)
    save(2)
    first = checkpoint.path_for(tmp_path, 1)
    _flip_digest(first.with_name(first.name + ".sha256"))
    save(3)
    assert first.exists() and first.with_name(first.name + ".sha256").exists()
    assert "step_000000001.pt is kept beyond checkpoint.keep=2: checksum mismatch" in caplog.text
    save(4)
    steps = [int(p.stem[5:]) for p in retention.list_checkpoints(tmp_path)]
    assert steps == [4, 3, 1], "the verified step 2 went, the unverified step 1 stayed"
    assert (
        sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if "000000002" in p.name) == []
    )
