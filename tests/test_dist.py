"""Environment detection, from tables of environments (pure: no processes)."""

from __future__ import annotations

import pytest

from expctl.dist import (
    PORT_LOW,
    PORT_SPAN,
    DistEnv,
    derive_port,
    detect,
    expand_nodelist,
    expand_tasks_per_node,
)
from expctl.errors import UserError

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29400",
    "TORCHELASTIC_RUN_ID": "abc",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
SRUN_2x2 = {
    "SLURM_JOB_ID": "77",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}
BATCH_SHELL = {
    "SLURM_JOB_ID": "78",
    "SLURM_NTASKS": "4",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
}


def test_single_process() -> None:
    env = detect({})
    assert env == DistEnv()
    assert env.is_main and not env.distributed


def test_torchrun() -> None:
    env = detect(TORCHRUN)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (1, 2, "n1", 29400)
    assert env.source == "torchrun" and env.restart_count == 2 and env.run_id == "abc"


def test_torchrun_default_run_id_is_not_an_id() -> None:
    assert detect({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}).run_id is None


def test_torchrun_wins_over_slurm() -> None:
    assert detect({**SRUN_2x2, **TORCHRUN}).source == "torchrun"


def test_srun_two_nodes_two_tasks_each() -> None:
    env = detect(SRUN_2x2)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr) == (1, 2, "node1")
    assert env.source == "slurm" and env.job_id == "77" and env.run_id == "job77"
    assert PORT_LOW <= env.master_port < PORT_LOW + PORT_SPAN


def test_srun_port_depends_on_job_and_step_and_explicit_port_wins() -> None:
    a, b = detect(SRUN_2x2), detect({**SRUN_2x2, "SLURM_JOB_ID": "79"})
    c = detect({**SRUN_2x2, "SLURM_STEP_ID": "1"})
    assert len({a.master_port, b.master_port, c.master_port}) == 3
    assert detect({**SRUN_2x2, "MASTER_PORT": "31000", "MASTER_ADDR": "x"}).master_port == 31000
    assert detect({**SRUN_2x2, "MASTER_ADDR": "x"}).master_addr == "x"
    assert c.run_id == "job77.1"


def test_array_job_names_the_run_by_array_task() -> None:
    env = detect({**SRUN_2x2, "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "5"})
    assert env.job_id == "70_5" and env.run_id == "job70_5"


@pytest.mark.parametrize(
    "shell",
    [BATCH_SHELL, {"SLURM_JOB_ID": "9", "SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"}],
)
def test_batch_and_salloc_shells_are_one_process(shell: dict[str, str]) -> None:
    env = detect(shell)
    assert env.world_size == 1 and env.source == "single" and env.job_id == shell["SLURM_JOB_ID"]


def test_submitit_is_named() -> None:
    assert detect({**SRUN_2x2, "SUBMITIT_EXECUTOR": "slurm"}).source == "submitit"


def test_inconsistent_slurm_layout_fails_fast_with_hint() -> None:
    with pytest.raises(UserError) as e:
        detect({**SRUN_2x2, "SLURM_STEP_NUM_TASKS": "3"})
    assert "inconsistent" in e.value.message and "--ntasks-per-node" in (e.value.hint or "")


@pytest.mark.parametrize(("gpus", "fix"), [(4, "--ntasks-per-node=4"), (1, "--ntasks-per-node=1")])
def test_tasks_per_node_must_match_gpus_under_slurm(gpus: int, fix: str) -> None:
    with pytest.raises(UserError) as e:
        detect(SRUN_2x2, gpus_per_node=gpus)
    assert fix in (e.value.hint or "")
    assert detect(SRUN_2x2, gpus_per_node=2).local_world_size == 2


@pytest.mark.parametrize(("spec", "out"), [("2(x3),1", [2, 2, 2, 1]), ("4", [4]), ("1,2", [1, 2])])
def test_tasks_per_node_syntax(spec: str, out: list[int]) -> None:
    assert expand_tasks_per_node(spec) == out


def test_derived_ports_spread_over_the_range() -> None:
    ports = {derive_port(f"{j}.0") for j in range(2000)}
    # 2000 keys into 12000 ports: about 1842 distinct if the hash spreads evenly
    assert len(ports) > 1800 and min(ports) >= PORT_LOW and max(ports) < PORT_LOW + PORT_SPAN
    assert max(ports) < 32768, "below Linux's ephemeral ports, which client sockets take"


def test_bad_integer_is_a_user_error() -> None:
    with pytest.raises(UserError, match="WORLD_SIZE"):
        detect({**TORCHRUN, "WORLD_SIZE": "two"})


# what `scontrol show hostnames` prints (Slurm 23+), one host list per row
NODELISTS = [
    ("node1", ["node1"]),
    ("a,b", ["a", "b"]),
    ("node[1-2]", ["node1", "node2"]),
    ("n[1,3-4],m", ["n1", "n3", "n4", "m"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("x[009-011]", ["x009", "x010", "x011"]),
    ("n-[1-2]", ["n-1", "n-2"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[1-3]a[5-6]", ["n1a5", "n1a6", "n2a5", "n2a6", "n3a5", "n3a6"]),
]


@pytest.mark.parametrize(("spec", "hosts"), NODELISTS)
def test_slurm_host_lists_expand_as_scontrol_does(spec: str, hosts: list[str]) -> None:
    assert expand_nodelist(spec) == hosts


@pytest.mark.parametrize("spec", ["n[1-2", "n[a-b]", "n[3-1]", "n[]", "a,,b", ""])
def test_a_malformed_host_list_is_a_user_error(spec: str) -> None:
    with pytest.raises(UserError, match="is malformed"):
        expand_nodelist(spec)


def test_host_lists_agree_with_scontrol_where_slurm_is_installed() -> None:
    import shutil
    import subprocess

    if shutil.which("scontrol") is None:
        pytest.skip("no Slurm client")
    for spec, hosts in NODELISTS:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", spec], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            pytest.skip(f"scontrol cannot run here: {out.stderr.strip()[:200]}")
        assert out.stdout.split() == hosts == expand_nodelist(spec), spec


def test_srun_on_zero_padded_nodes_picks_the_first_as_master() -> None:
    env = detect({**SRUN_2x2, "SLURM_STEP_NODELIST": "gpu[007-008]"})
    assert env.master_addr == "gpu007" and env.num_nodes == 2


@pytest.mark.parametrize("omp", [None, "3"])
def test_the_ranks_of_a_node_split_its_cores(
    monkeypatch: pytest.MonkeyPatch, omp: str | None
) -> None:
    """Each of N ranks on a node gets cores/N intra-op threads, on any device (torch's agent,
    which launcher=local uses, sets no OMP_NUM_THREADS, so every rank would start one per core);
    an OMP_NUM_THREADS the user or torchrun set is left to torch."""
    import os

    import torch

    from expctl.config import compose
    from expctl.rank.build import pick_device

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    cfg = compose.compose(None, ["train.device=auto"])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(7)
        pick_device(cfg, DistEnv(rank=1, local_rank=1, world_size=2, local_world_size=2))
        want = 7 if omp else max(1, (os.cpu_count() or 1) // 2)
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
