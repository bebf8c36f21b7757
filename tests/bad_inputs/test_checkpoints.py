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
