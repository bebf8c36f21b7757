"""The loop's garbage collection (`rank.collector.GarbageCollection`): when it collects, what it
leaves as it found, and that importing it changes nothing in the process."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from expctl.rank.collector import FULL_GC, GarbageCollection


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations collected while the test runs; the collector left as it was."""
    seen: list[int] = []

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(int(info["generation"]))

    was = gc.isenabled()
    gc.callbacks.append(watch)
    yield seen
    gc.callbacks.remove(watch)
    (gc.enable if was else gc.disable)()


def test_it_collects_young_generations_every_n_steps_and_all_every_full_gc_th(
    collections: list[int],
) -> None:
    gc.enable()
    with GarbageCollection(3) as collector:
        assert not gc.isenabled()
        for step in range(1, 3 * FULL_GC + 1):
            collector.after_step(step)
    assert gc.isenabled()
    assert collections == [1] * (FULL_GC - 1) + [2]


@pytest.mark.parametrize("every, enabled", [(0, True), (5, False)])
def test_with_zero_or_a_collector_the_user_turned_off_it_does_nothing(
    collections: list[int], every: int, enabled: bool
) -> None:
    (gc.enable if enabled else gc.disable)()
    with GarbageCollection(every) as collector:
        assert gc.isenabled() is enabled
        for step in range(1, 11):
            collector.after_step(step)
    assert gc.isenabled() is enabled
    assert collections == []


def test_importing_the_loop_registers_no_fork_hook() -> None:
    """No import-time side effects: the fork hook comes with the first collector entered."""
    code = (
        "from expctl.rank import collector, entry, train\n"
        "assert not collector._HOOKED\n"
        "with collector.GarbageCollection(2):\n"
        "    assert collector._HOOKED\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
