"""The sbatch script expctl writes, and values that must never reach it: pure, no cluster needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TINY

from expctl.config import compose
from expctl.errors import UserError
from expctl.jobs import slurm


def test_rendered_sbatch_script_matches_the_expected_one(tmp_path: Path) -> None:
    (tmp_path / "tiny.yml").write_text(TINY)
    cfg = compose.compose(
        str(tmp_path / "tiny.yml"),
        [
            "launcher=slurm",
            "launcher.nodes=2",
            "launcher.partition=debug",
            "launcher.timeout_min=30",
            "launcher.cpus_per_task=4",
            "launcher.mem_gb=8",
            "launcher.sbatch.mail-type=END",
            "launcher.setup=[module load cuda]",
        ],
    )
    text = slurm.render(cfg, Path("/RUN_DIR")).replace(sys.executable, "PYTHON")
    expected = (Path(__file__).parent / "data" / "sbatch_expected.txt").read_text()
    assert text == expected


@pytest.mark.parametrize(
    "value", ["debug; rm -rf ~", "$(reboot)", "a b", "x\n#SBATCH --uid=0", "`id`", "x\n", "p\x00"]
)
def test_hostile_sbatch_values_are_rejected(value: str) -> None:
    cfg = compose.compose(None, ["launcher=slurm"])
    with pytest.raises(UserError, match="sbatch values may only hold"):
        slurm.parameters(cfg.replace("launcher", partition=value))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mail-type", "END;reboot"),
        ("nodes", "3"),
        ("signal", "KILL"),
        ("Bad Key", "1"),
        ("mail-type\n", "END"),
        ("comment", "a\n"),
    ],
)
def test_sbatch_options_are_checked_by_name_and_value(key: str, value: str) -> None:
    cfg = compose.compose(None, ["launcher=slurm"])
    with pytest.raises(UserError, match="sbatch"):
        slurm.parameters(cfg.replace("launcher", sbatch={key: value}))


@pytest.mark.parametrize(
    ("override", "where"),
    [
        ("run.root='a\n#SBATCH --uid=0'", "run.root"),
        ("run.dir='a\nb'", "run.dir"),
        ("run.name='n\n'", "run.name"),
        ("launcher.job_name='j\n'", "launcher.job_name"),
        ("launcher.setup=['module load x\nrm -rf ~']", "launcher.setup[0]"),
        ("+launcher.sbatch.comment='c\n'", "launcher.sbatch.comment"),
    ],
)
def test_nothing_splits_a_line_of_the_script(override: str, where: str) -> None:
    """Values that reach the script (as paths, names or lines) are refused with a newline, when
    the config is composed: before `expctl show` prints it or a job is written."""
    with pytest.raises(UserError) as e:
        compose.compose(None, ["launcher=slurm", override], check_components=False)
    assert e.value.message.startswith(f"{where}=") and "\\n" in e.value.message
    assert len(str(e.value).splitlines()) == 2
