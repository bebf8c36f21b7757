"""The import rule of ARCHITECTURE.md, checked by import-linter, and what must import without torch."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from expctl import errors

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the package found under `root` (ahead of the installed one)."""
    return subprocess.run(
        [str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_rule_holds() -> None:
    proc = _lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def _floors_in_architecture_md() -> list[list[str]]:
    """The floors of ARCHITECTURE.md's "The import rule", top first, each a list of rooms."""
    section = ARCHITECTURE.split("## The import rule", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n", 2)[1]
    return [[room.strip() for room in line.split("|")] for line in block.splitlines() if line]


def _module_map() -> dict[str, set[str]]:
    """ARCHITECTURE.md's module map: folder (`expctl/`, `expctl/rank/`, ...) -> the rooms its
    table names (`train.py`, `datasets/`)."""
    section = ARCHITECTURE.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rooms: dict[str, set[str]] = {}
    for part in section.split("\n### ")[1:]:
        folder = re.match(r"`([^`]+)`", part)
        assert folder, part.splitlines()[0]
        rows = [line.split("|")[1] for line in part.splitlines() if line.startswith("| `")]
        rooms[folder[1]] = {name for row in rows for name in re.findall(r"`([^`]+)`", row)}
    return rooms


ARCHITECTURE = (REPO / "ARCHITECTURE.md").read_text()


def test_architecture_md_floors_are_the_wings_contract_and_its_map_the_folders() -> None:
    """The floors ARCHITECTURE.md draws are pyproject's `wings` contract, every wing and module of
    expctl/ stands on one, and the module map names every module where it lies (no more, no
    fewer): the page cannot drift from the code it describes."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (wings,) = [c for c in config["contracts"] if c.get("id") == "wings"]
    contract = [[r.strip().removeprefix("expctl.") for r in f.split("|")] for f in wings["layers"]]
    floors = _floors_in_architecture_md()
    assert floors == contract, "ARCHITECTURE.md's floors differ from pyproject's wings contract"

    package = REPO / "expctl"
    folders = sorted(d for d in package.iterdir() if (d / "__init__.py").is_file())
    wing_dirs = [d for d in folders if d.name != "conf"]  # conf/: YAML presets, no code
    top = {f.stem for f in package.glob("*.py")} - {"__init__", "__main__"}
    assert sorted(r for f in floors for r in f) == sorted(top | {d.name for d in wing_dirs})

    found = {"expctl/": {f.name for f in package.glob("*.py")} | {d.name + "/" for d in folders}}
    for wing in wing_dirs:
        found[f"expctl/{wing.name}/"] = {f.name for f in wing.glob("*.py")} - {"__init__.py"} | {
            d.name + "/" for d in wing.iterdir() if (d / "__init__.py").is_file()
        }
    found["expctl/"] -= {d.name + "/" for d in wing_dirs}
    assert _module_map() == found


def test_the_import_rule_fails_on_a_planted_import_of_slurm_in_the_loop(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "expctl", tmp_path / "expctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    train = tmp_path / "expctl" / "rank" / "train.py"
    train.write_text(train.read_text() + "\nimport expctl.jobs.slurm  # noqa\n")
    proc = _lint(tmp_path)
    assert proc.returncode == 1, proc.stdout  # lint-imports: a broken contract
    assert "BROKEN" in proc.stdout and "expctl.rank.train -> expctl.jobs.slurm" in proc.stdout, (
        proc.stdout
    )


def test_exceptions_exit_codes_hooks_and_layout_import_without_torch() -> None:
    code = (
        "import sys\n"
        "from expctl.errors import CheckpointError, Preempted, RunError, UserError, EXIT_USER\n"
        "import expctl.rank.hooks, expctl.layout\n"
        "heavy = [m for m in ('torch', 'hydra', 'omegaconf', 'optuna') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sbatch_templates_use_the_exit_codes_of_expctl_errors() -> None:
    for template in sorted((REPO / "slurm").glob("*.sbatch")):
        text = template.read_text()
        found = dict(re.findall(r"\b(EXIT_USER|EXIT_PREEMPTED)=(\d+)", text))
        assert found == {
            "EXIT_USER": str(errors.EXIT_USER),
            "EXIT_PREEMPTED": str(errors.EXIT_PREEMPTED),
        }, template.name
        assert re.search(r"-ne [23]\b|exit [23]\b", text) is None, f"{template.name}: a bare code"


def test_the_module_paths_from_before_the_wings_import_for_one_release_with_a_warning() -> None:
    """Every module's old path (`expctl.loggers`, `expctl.datasets.idx`) is the moved module
    itself, with a DeprecationWarning at the line that imports it; no module of expctl imports
    an old path (nor does `expctl --help`)."""
    code = (
        "import importlib, pkgutil, warnings\n"
        "import expctl\n"
        "from expctl._moved import MOVED\n"
        "warnings.filterwarnings('error', category=DeprecationWarning, module=r'expctl\\b')\n"
        "for m in pkgutil.walk_packages(expctl.__path__, 'expctl.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "warnings.resetwarnings()\n"
        "for old in [*MOVED, 'datasets.idx']:\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        exec(f'import expctl.{old}')  # a plain import statement, at line 1 of <string>\n"
        "    got = importlib.import_module('expctl.' + old)\n"
        "    new = 'expctl.' + MOVED.get(old, 'builtin.' + old)\n"
        "    assert got is importlib.import_module(new) and got.__spec__.name == new, old\n"
        "    assert [(w.category, w.filename) for w in seen] == [(DeprecationWarning, '<string>')]\n"
        "    assert f'is {new} now' in str(seen[0].message), seen[0].message\n"
        "from expctl.loggers import Logger\n"
        "from expctl.builtin.loggers import Logger as New\n"
        "assert Logger is New\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=180)
    proc = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-m", "expctl", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr, proc.stderr


def test_only_layout_names_a_checkpoint_file_or_writes_a_temporary_one() -> None:
    """layout.py spells every file name of a run once and atomic.py holds the one atomic writer
    (`atomic_file`): no other module renames a temporary file into place or names one."""
    spelled = re.compile(r"os\.replace\(|\.rename\(|\.tmp-|[\"']step_|\.sha256[\"']")
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "expctl").rglob("*.py"))
        if path.relative_to(REPO / "expctl").as_posix() not in ("layout.py", "atomic.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if spelled.search(line)
    ]
    assert found == [], "\n".join(found)
