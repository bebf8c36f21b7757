"""The README's plugin examples run as written: each Python block whose first line reads
`# NAME.py  (expctl run ARGS)` is saved as NAME.py and that command runs it (on a tiny config)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO, SMALL, cli_env
from conftest import expctl as run_cli

BLOCK = re.compile(r"```python\n# (\w+)\.py +\(expctl run ([^)\n]+)\)\n(.*?)```", re.S)
EXAMPLES = {
    m.group(1): (m.group(2), m.group(0)[10:-3])
    for m in BLOCK.finditer((REPO / "README.md").read_text())
}


def test_the_readme_has_the_step_and_logger_examples() -> None:
    assert {"my_step", "my_logger"} <= EXAMPLES.keys(), sorted(EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_a_readme_example_runs_as_its_comment_says(name: str, tmp_path: Path) -> None:
    command, code = EXAMPLES[name]
    (tmp_path / f"{name}.py").write_text(code)
    args = shlex.split(command)
    proc = run_cli(
        "run", *args, *SMALL, "train.max_steps=8", "run.dir=r", cwd=tmp_path, env=cli_env()
    )
    result = json.loads((tmp_path / "r" / "result.json").read_text())
    assert result["status"] == "completed", proc.stdout[-2000:]
    if name == "my_step":  # top-2 accuracy: reported, and monitored (checkpoint.monitor)
        assert 0 < result["val/top2"] <= 1, result
    if name == "my_logger":
        assert ">> completed" in proc.stdout, proc.stdout[-2000:]
