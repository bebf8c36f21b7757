"""Start-up helpers: the cycle collector paused while torch loads, left as it was found."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from expctl.startup import paused_gc


@pytest.fixture
def collector() -> Iterator[None]:
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_gc_leaves_the_collector_as_it_found_it(collector: None, enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled
    with pytest.raises(KeyError), paused_gc():
        raise KeyError("x")
    assert gc.isenabled() is enabled


def test_paused_gc_freezes_what_an_import_made_and_nothing_else(
    collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.unfreeze()
    with paused_gc():
        made = [[] for _ in range(100)]
    assert gc.get_freeze_count() == 0  # nothing imported: a later collection still sees `made`
    (tmp_path / "expctl_fresh_module.py").write_text("TABLE = [[i] for i in range(100)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with paused_gc():
        import expctl_fresh_module  # noqa: F401
    sys.modules.pop("expctl_fresh_module")
    assert gc.get_freeze_count() >= 100
    del made


def test_paused_gc_without_freeze_freezes_nothing(
    collector: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build.py pauses the collector around the first optimizer without freezing, unless the
    process ends with the run (`freeze_for_this_run`): process groups may exist by then, and
    frozen ones outlived the workers' clean exit (an abort at exit)."""
    gc.unfreeze()
    (tmp_path / "expctl_other_module.py").write_text("TABLE = [[i] for i in range(100)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with paused_gc(freeze=False):
        assert not gc.isenabled()
        import expctl_other_module  # noqa: F401
    sys.modules.pop("expctl_other_module")
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
@pytest.mark.parametrize("says", [True, False])
def test_only_a_process_that_ends_with_its_one_rank_run_freezes_at_the_first_optimizer(
    tmp_path: Path, says: bool
) -> None:
    """`expctl run` says its process is the run's (`process_is_the_run`): then a one-rank run
    freezes what the first optimizer's import made (with the run's objects). A notebook's
    `expctl.run`, which never says it, freezes nothing there; nor do ranks of a process group
    (`freeze_for_this_run(distributed=True)`). A fresh interpreter each: the flag is per process."""
    import subprocess

    import conftest

    code = (
        "import gc, sys\n"
        "from expctl import startup\nfrom expctl.config import compose\nfrom expctl.rank import entry as rank\n"
        "from expctl.dist import DistEnv\n"
        "from expctl.rank.hooks import Hooks\n"
        f"if {says}: startup.process_is_the_run()\n"
        "assert not startup.freeze_for_this_run(True)\n"
        "gc.unfreeze()\n"
        f"cfg = compose.compose(None, {conftest.SMALL!r} + ['train.device=cpu', "
        f"'train.max_steps=1', 'run.dir={tmp_path / 'run'}'])\n"
        "rank.main(cfg, DistEnv(), Hooks())\n"
        "print(gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env=conftest.cli_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    frozen = int(out.stdout.split()[-1])
    assert (frozen > 10_000) if says else (frozen == 0)
