"""How a sweep shares the machine (resources.py): pure, a machine is described, not detected."""

from __future__ import annotations

import pytest

from expctl.errors import UserError
from expctl.sweep.resources import Allocator, Machine, plan


def machine(cores: int, gpus: int) -> Machine:
    return Machine(tuple(range(cores)), tuple(str(g) for g in range(gpus)))


def fill(alloc: Allocator) -> list:
    slots = []
    while (slot := alloc.take()) is not None:
        slots.append(slot)
    return slots


def test_a_fraction_packs_per_gpu_never_across_gpus() -> None:
    """0.15 GPU per trial on 8 GPUs: 8 x floor(1/0.15) = 48 trials, not floor(8/0.15) = 53."""
    p = plan(machine(96, 8), 0.15, None, None, trials=100)
    assert p.concurrent == 48 and p.share.per_gpu == 6 and p.share.cpus == 2
    slots = fill(Allocator(p))
    assert len(slots) == 48 and all(len(s.gpus) == 1 for s in slots)
    per_gpu = {g: sum(s.gpus == (g,) for s in slots) for g in p.machine.gpus}
    assert set(per_gpu.values()) == {6}
    cores = [c for s in slots for c in s.cores]
    assert len(cores) == len(set(cores)) == 96, "disjoint blocks of cores"


@pytest.mark.parametrize(
    ("share", "per_gpu"), [(0.25, 4), (0.5, 2), (0.1, 10), (1 / 3, 3), (0.3, 3)]
)
def test_shares_that_divide_one_pack_exactly(share: float, per_gpu: int) -> None:
    assert plan(machine(64, 2), share, None, None, trials=100).share.per_gpu == per_gpu


def test_fewer_trials_than_room_spread_over_the_gpus_first() -> None:
    """4 trials of 0.25 GPU on 4 GPUs: one per GPU, not four on GPU 0 and three idle GPUs."""
    slots = fill(Allocator(plan(machine(16, 4), 0.25, None, None, trials=4)))
    assert sorted(s.gpus for s in slots) == [("0",), ("1",), ("2",), ("3",)]


def test_whole_gpus_are_never_shared_and_come_back_when_a_trial_ends() -> None:
    p = plan(machine(16, 4), 1, None, None, trials=16)
    alloc = Allocator(p)
    first = fill(alloc)
    assert p.concurrent == 4 and [s.gpus for s in first] == [("0",), ("1",), ("2",), ("3",)]
    assert alloc.take() is None, "no fifth trial on an occupied GPU"
    alloc.give_back(first[2])
    again = alloc.take()
    assert again is not None and again.gpus == ("2",) and again.cores == first[2].cores
    for _ in range(20):  # the sweep goes on to its end: shares keep coming back
        alloc.give_back(again)
        again = alloc.take()
        assert again is not None


def test_n_gpus_per_trial_takes_n_idle_gpus() -> None:
    p = plan(machine(32, 4), 2, None, None, trials=8)
    alloc = Allocator(p)
    slots = fill(alloc)
    assert [s.gpus for s in slots] == [("0", "1"), ("2", "3")] and p.share.cpus == 16
    alloc.give_back(slots[0])
    assert alloc.take().gpus == ("0", "1")  # type: ignore[union-attr]


def test_a_cpu_machine_runs_a_trial_per_core_and_max_concurrent_caps_it() -> None:
    assert plan(machine(2, 0), None, None, None, trials=8).concurrent == 2
    capped = plan(machine(8, 0), None, None, 2, trials=8)
    assert capped.concurrent == 2 and capped.share.cpus == 4, "the cores divided evenly"
    assert plan(machine(8, 0), None, None, None, trials=8, ranks=2).concurrent == 4
    assert plan(machine(8, 0), None, 3, None, trials=8).concurrent == 2
    assert plan(machine(8, 0), None, None, None, trials=1).concurrent == 1


def test_a_max_concurrent_the_shares_cannot_reach_says_which_share_limits_it() -> None:
    cpu = plan(machine(2, 0), None, 2, 4, trials=8)
    assert cpu.concurrent == 1 and cpu.describe().endswith(
        "(sweep.max_concurrent=4, but sweep.cpus_per_trial=2 on 2 core(s) fit 1)"
    )
    gpu = plan(machine(16, 2), 1, None, 4, trials=8)
    assert gpu.concurrent == 2 and "but sweep.gpus_per_trial=1 on 2 GPU(s) fit 2" in gpu.describe()
    assert plan(machine(16, 2), 1, None, 2, trials=8).capped == ""
    assert plan(machine(16, 2), 1, None, 4, trials=1).capped == "", "one trial: one at a time"


def test_more_trials_than_cores_when_asked_share_the_cores_evenly() -> None:
    p = plan(machine(2, 0), None, None, 4, trials=4)
    slots = fill(Allocator(p))
    assert p.concurrent == 4 and "sharing cores" in p.describe()
    assert sorted(s.cores for s in slots) == [(0,), (0,), (1,), (1,)]


def test_gpus_visible_to_the_driver_are_named_as_cuda_visible_devices_names_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert Machine.here(2).gpus == ("3", "5")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert Machine.here(2).gpus == ("0", "1")


@pytest.mark.parametrize(
    ("gpus", "cpus", "cores", "n_gpus", "says"),
    [
        (1.5, None, 8, 4, "sweep.gpus_per_trial=2"),
        (1, None, 8, 0, "no GPU visible"),
        (8, None, 8, 4, "sweep.gpus_per_trial=4 or fewer"),
        (None, 16, 8, 0, "sweep.cpus_per_trial=8 or fewer"),
        (1e-320, None, 8, 1, "sweep.gpus_per_trial=0.001 or more"),  # was an OverflowError
        (1e-300, None, 8, 1, "sweep.gpus_per_trial=0.001 or more"),  # "up to 1e300 per GPU"
    ],
)
def test_shares_the_machine_cannot_give_are_user_errors(
    gpus: float | None, cpus: int | None, cores: int, n_gpus: int, says: str
) -> None:
    with pytest.raises(UserError) as e:
        plan(machine(cores, n_gpus), gpus, cpus, None, trials=4)
    assert says in f"{e.value.message} {e.value.hint}"


def test_the_board_draws_a_line_per_running_trial_in_place_on_a_terminal(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal: events above, a block of one line per running trial (its GPU, step,
    metric), redrawn in place; elsewhere only the events (the block every minute)."""
    import io
    import json
    import time

    from expctl.jobs.study import TrialRef
    from expctl.sweep import trials
    from expctl.sweep.board import Board
    from expctl.sweep.pool import Proc
    from expctl.sweep.resources import Slot

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    run = tmp_path / "trial_003"
    run.mkdir()
    rows = [{"step": 40, "train/loss": 1.0}, {"step": 40, "val/acc": 0.8125, "val/loss": 0.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = trials.Running(
        3,
        Proc(3, [], {}, (0,), run / "output.log", pid=1, started=time.time()),
        Slot(("1",), (4, 5, 6, 7)),
        TrialRef(str(tmp_path), 3),
        "optim.lr=0.1",
    )
    out = Terminal()
    board = Board(out, tmp_path)
    board.started(r)
    board.show([r])
    board.show([r])  # redrawn over the last block, not below it
    board.close()
    text = out.getvalue()
    assert text.startswith("expctl: trial 3 started on GPU 1 (cores 4-7): optim.lr=0.1\n")
    line = "  trial 3  GPU 1  step 40  val/acc=0.8125  0:00  optim.lr=0.1\n"
    assert text.count(line) == 2 and "\x1b[1F\x1b[J" in text
    # a line wider than the terminal would wrap onto two rows: the redraw would move up one
    monkeypatch.setenv("COLUMNS", "40")
    narrow = Terminal()
    Board(narrow, tmp_path).show([r])
    assert narrow.getvalue() == line[:39] + "\n"
    plain = io.StringIO()
    quiet = Board(plain, tmp_path)
    quiet.show([r])
    assert plain.getvalue() == "", "no block off a terminal until quiet_s has passed"


def test_out_of_memory_on_a_shared_gpu_names_the_setting_that_packed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from expctl.jobs.study import SHARE_ENV, failure_text

    class OutOfMemoryError(RuntimeError):  # torch's, by name: the ledger imports no torch
        pass

    from expctl.errors import OutOfMemory

    oom = OutOfMemoryError("CUDA out of memory. Tried to allocate 784.00 MiB")
    said = OutOfMemory("rank 0: out of GPU memory near step 3: ... To fit: ...")  # the rank's
    assert failure_text(oom).startswith("OutOfMemoryError: CUDA out of memory"), "a GPU of its own"
    assert failure_text(said) == str(said)
    monkeypatch.setenv(SHARE_ENV, "4")
    for error in (oom, said):
        text = failure_text(error)
        assert "shared by up to 4 trials" in text and "sweep.gpus_per_trial" in text
    assert failure_text(ValueError("x\ny")) == "ValueError: x"


def test_a_trial_sees_its_gpus_and_a_shared_gpu_turns_the_cudnn_autotuner_off() -> None:
    """Packed trials (0.25 GPU each) run without cuDNN's autotuner, which would time kernels
    against the other trials' work; a trial with a GPU of its own keeps it; the user's
    EXPCTL_CUDNN_BENCHMARK stands."""
    from expctl.dist import CUDNN_BENCHMARK_ENV
    from expctl.jobs.study import SHARE_ENV
    from expctl.sweep.trials import trial_env

    packed = fill(Allocator(plan(machine(16, 2), 0.25, None, None, trials=8)))[0]
    own = fill(Allocator(plan(machine(16, 2), 1, None, None, trials=2)))[0]
    cpu = fill(Allocator(plan(machine(4, 0), None, None, None, trials=2)))[0]
    assert trial_env(packed, True, {}) == {
        "CUDA_VISIBLE_DEVICES": packed.gpus[0],
        SHARE_ENV: "4",
        CUDNN_BENCHMARK_ENV: "0",
    }
    user = trial_env(packed, True, {CUDNN_BENCHMARK_ENV: "1"})  # inherited, as it is
    assert CUDNN_BENCHMARK_ENV not in user and user[SHARE_ENV] == "4"
    assert trial_env(own, True, {}) == {"CUDA_VISIBLE_DEVICES": own.gpus[0]}
    assert trial_env(cpu, True, {}) == {"CUDA_VISIBLE_DEVICES": ""}
    assert trial_env(cpu, False, {}) == {}
