"""Where this process sits in the job: one pure function from the environment to a frozen DistEnv.

Detection order (as Lightning): torchrun / torch elastic -> Slurm ``srun`` task -> one process.
The process group is set up in `init_process_group`, the only place besides `apply_env` that
touches ``os.environ``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from expctl.errors import UserError

log = logging.getLogger("expctl")

# job-derived ports land in [20000, 32000): below Linux's ephemeral range (32768-60999), where a
# client connection of another job on the node may already hold the port
PORT_LOW, PORT_SPAN = 20000, 12000
# "0" turns cuDNN's autotuner off: a sweep sets it for trials that share a GPU, where the
# autotuner times kernels against the other trials' work (noise) and costs each trial ~2 s
CUDNN_BENCHMARK_ENV = "EXPCTL_CUDNN_BENCHMARK"


@dataclass(frozen=True)
class DistEnv:
    """The rank layout of this process and how to reach rank 0."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    source: str = "single"  # single | torchrun | slurm | submitit
    job_id: str | None = None  # Slurm job id (array: ARRAYJOB_TASK); names the run directory
    run_id: str | None = (
        None  # an id every rank agrees on without talking, if the launcher gave one
    )
    restart_count: int = 0
    agent_store: bool = False  # torch's elastic agent already hosts the store at master_addr:port

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that writes to the run directory."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one rank."""
        return self.world_size > 1


def detect(environ: Mapping[str, str], gpus_per_node: int | None = None) -> DistEnv:
    """Detect the rank layout from an environment mapping (pure: reads nothing else).

    Args:
        environ: usually ``os.environ``.
        gpus_per_node: visible GPUs when training on CUDA; None skips the tasks-per-GPU check.

    Raises:
        UserError: an inconsistent layout, with a HINT naming the fix.
    """
    if all(k in environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        env = _from_torchrun(environ)
    elif "SLURM_JOB_ID" in environ and "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:
        env = _from_slurm(environ)
    else:
        job = _slurm_job_id(environ) if "SLURM_JOB_ID" in environ else None
        env = DistEnv(
            job_id=job,
            run_id=f"job{job}" if job else None,
            master_port=_int(environ, "MASTER_PORT", 0),
        )
    if gpus_per_node is not None and gpus_per_node > 0 and env.local_world_size != gpus_per_node:
        more = env.local_world_size > gpus_per_node
        raise UserError(
            f"{env.local_world_size} ranks on this node but {gpus_per_node} visible GPU(s) "
            f"(from {env.source}): " + ("ranks would share a GPU" if more else "GPUs would idle"),
            _layout_hint(env, gpus_per_node),
        )
    return env


def _layout_hint(env: DistEnv, gpus: int) -> str:
    if env.source in ("slurm", "submitit"):
        return f"use one task per GPU: srun --ntasks-per-node={gpus} (or launcher.tasks_per_node={gpus})"
    if env.source == "torchrun":
        return f"use torchrun --nproc_per_node={gpus}"
    return f"use launcher=local launcher.nproc={gpus}, or train.device=cpu"


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = environ.get(key)
    if raw is None or raw == "":
        if default is None:
            raise UserError(f"environment variable {key} is not set", "run under torchrun or srun")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"environment variable {key}={raw!r} is not an integer") from None


def _from_torchrun(environ: Mapping[str, str]) -> DistEnv:
    world = _int(environ, "WORLD_SIZE")
    local_world = _int(environ, "LOCAL_WORLD_SIZE", world)
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    job = _slurm_job_id(environ) if "SLURM_JOB_ID" in environ else None
    return DistEnv(
        rank=_int(environ, "RANK"),
        local_rank=_int(environ, "LOCAL_RANK"),
        world_size=world,
        local_world_size=local_world,
        node_rank=_int(environ, "GROUP_RANK", 0),
        num_nodes=max(1, world // max(local_world, 1)),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(environ, "MASTER_PORT", 29500),
        source="torchrun",
        job_id=job,
        run_id=None if run_id in (None, "", "none") else run_id,
        restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
        agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
    )


def _from_slurm(environ: Mapping[str, str]) -> DistEnv:
    world = _int(environ, "SLURM_STEP_NUM_TASKS", _int(environ, "SLURM_NTASKS", 1))
    node_rank = _int(environ, "SLURM_NODEID", 0)
    nodes_raw = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    hosts = expand_nodelist(nodes_raw) if nodes_raw else ["127.0.0.1"]
    per_node = expand_tasks_per_node(
        environ.get("SLURM_STEP_TASKS_PER_NODE")
        or environ.get("SLURM_TASKS_PER_NODE")
        or str(world)
    )
    if sum(per_node) != world or len(per_node) != len(hosts):
        raise UserError(
            f"Slurm layout is inconsistent: {world} tasks but tasks per node "
            f"{per_node} over {len(hosts)} node(s) ({nodes_raw})",
            "give srun a consistent layout: srun -N NODES --ntasks-per-node=TASKS "
            "(with SLURM_NTASKS = NODES x TASKS)",
        )
    job = _slurm_job_id(environ)
    step = environ.get("SLURM_STEP_ID", "0")
    port = _int(environ, "MASTER_PORT", 0) or derive_port(f"{job}.{step}")
    return DistEnv(
        rank=_int(environ, "SLURM_PROCID"),
        local_rank=_int(environ, "SLURM_LOCALID", 0),
        world_size=world,
        local_world_size=per_node[node_rank] if node_rank < len(per_node) else 1,
        node_rank=node_rank,
        num_nodes=len(hosts),
        master_addr=environ.get("MASTER_ADDR") or hosts[0],
        master_port=port,
        source="submitit" if "SUBMITIT_EXECUTOR" in environ else "slurm",
        job_id=job,
        run_id=f"job{job}" if step in ("0", "") else f"job{job}.{step}",
        restart_count=_int(environ, "SLURM_RESTART_COUNT", 0),
    )


def _slurm_job_id(environ: Mapping[str, str]) -> str:
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's tasks-per-node syntax: '2(x3),1' -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "(x" in part:
            n, reps = part.rstrip(")").split("(x")
            out += [int(n)] * int(reps)
        else:
            out.append(int(part))
    return out


_HOSTS = r"(?:[^,\[\]]|\[[^\[\]]+\])+"  # one entry: literal text and [ranges] groups


def expand_nodelist(spec: str) -> list[str]:
    """Expand a Slurm host list as `scontrol show hostnames` does:
    'gpu[01-02,7],cpu1,rack[1-2]-n[1-2]' -> gpu01 gpu02 gpu7 cpu1 rack1-n1 rack1-n2 rack2-n1 rack2-n2.

    Raises:
        UserError: the list is malformed (an unclosed bracket, a range that is not numeric).
    """
    if not re.fullmatch(f"{_HOSTS}(?:,{_HOSTS})*", spec):
        raise _bad_nodelist(spec)
    hosts: list[str] = []
    for entry in re.findall(_HOSTS, spec):
        names = [""]
        for m in re.finditer(r"([^\[]*)(?:\[([^\]]*)\])?", entry):
            expanded = [""] if m.group(2) is None else _expand_ranges(m.group(2), spec)
            names = [n + m.group(1) + i for n in names for i in expanded]
        hosts += names
    return hosts


def _expand_ranges(ranges: str, spec: str) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7'] (zero-padded to the width of the range's start)."""
    out: list[str] = []
    for part in ranges.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if m is None or int(m.group(2) or m.group(1)) < int(m.group(1)):
            raise _bad_nodelist(spec)
        low, high = m.group(1), m.group(2) or m.group(1)
        out += [str(i).zfill(len(low)) for i in range(int(low), int(high) + 1)]
    return out


def _bad_nodelist(spec: str) -> UserError:
    return UserError(
        f"Slurm host list {spec!r} (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST) is malformed",
        "run inside a Slurm job step (srun), whose environment Slurm sets itself",
    )


def derive_port(key: str) -> int:
    """A port in [20000, 32000) from a job key: two jobs on one node rarely alias."""
    digest = hashlib.sha256(key.encode()).digest()
    return PORT_LOW + int.from_bytes(digest[:4], "big") % PORT_SPAN


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a sweep trial's share, a Slurm
    allocation's cores), not the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_sync_batchnorm(world_size: int, device_type: str) -> None:
    """Refuse train.sync_batchnorm where torch's SyncBatchNorm cannot run (its forward raises
    on CPU tensors).

    Raises:
        UserError: several ranks train on something other than CUDA.
    """
    if world_size > 1 and device_type != "cuda":
        raise UserError(
            f"train.sync_batchnorm=true, but torch's SyncBatchNorm runs only on GPUs and these "
            f"{world_size} ranks train on {device_type}",
            "set train.sync_batchnorm=false for CPU runs, or train on GPUs (train.device=cuda)",
        )


def apply_env(values: Mapping[str, Any], hidden: frozenset[str] = frozenset()) -> None:
    """Set the config's ``env:`` variables in this process, logging each change (the values of
    `hidden` keys, which came from the environment, are not written to the log)."""
    for key, value in values.items():
        old = os.environ.get(key)
        os.environ[key] = str(value)
        if key in hidden:
            log.info("env: %s set (its value comes from the environment)", key)
        elif old != str(value):
            log.info("env: %s=%s%s", key, value, "" if old is None else f" (was {old})")


def init_process_group(env: DistEnv, backend: str, rdzv_timeout_s: float, timeout_s: float) -> Any:
    """Join the process group for `env` (a no-op for one rank).

    Rank 0 hosts a TCPStore at master_addr:master_port (under torchrun the agent already does);
    the others connect within `rdzv_timeout_s`. Keys are prefixed by the restart count, so that
    workers restarted by the elastic agent never read a dead predecessor's address. Collectives
    time out after `timeout_s`.

    Returns:
        The job's key-value store (None for one rank).

    Raises:
        UserError: the port is taken or the master never appears, with a HINT.
    """
    if not env.distributed:
        return None
    # whatever blocks below (a silent peer on the port, a rank 0 that died after listening),
    # the rendezvous ends within the timeout: a watchdog ends the process with the message
    bounded = threading.Timer(
        rdzv_timeout_s + 5, _abort, args=(_store_error(env, rdzv_timeout_s, None),)
    )
    bounded.daemon = True
    bounded.start()
    try:
        return _join(env, backend, rdzv_timeout_s, timeout_s)
    finally:
        bounded.cancel()
        bounded.join()  # gone before the DataLoader workers fork (reader.py)


def _abort(error: UserError) -> None:
    print(f"expctl: error: {error}", file=sys.stderr, flush=True)
    os._exit(2)


def _join(env: DistEnv, backend: str, rdzv_timeout_s: float, timeout_s: float) -> Any:
    # torch off `show`, which detects the environment:
    import torch.distributed as dist  # noqa: PLC0415

    try:
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=env.is_main and not env.agent_store,
            timeout=timedelta(seconds=rdzv_timeout_s),
            wait_for_workers=False,
        )
    except Exception as e:  # torch raises RuntimeError/DistNetworkError/DistStoreError
        raise _store_error(env, rdzv_timeout_s, e) from None
    prefixed = dist.PrefixStore(f"expctl/restart_{env.restart_count}", store)
    dist.init_process_group(
        backend,
        store=prefixed,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return prefixed


def _store_error(env: DistEnv, rdzv_timeout_s: float, e: Exception | None) -> UserError:
    text = "no answer" if e is None else (str(e).strip().splitlines() or [type(e).__name__])[0]
    if env.is_main and not env.agent_store and e is not None:
        return UserError(
            f"rank 0 cannot listen on {env.master_addr}:{env.master_port} ({text[:160]})",
            "the port is taken: set MASTER_PORT to a free port in the job's environment",
        )
    return UserError(
        f"rank {env.rank} could not reach rank 0 at {env.master_addr}:{env.master_port} "
        f"within {rdzv_timeout_s:g} s ({text[:160]})",
        "check that rank 0 started (all tasks under one srun) and that MASTER_ADDR resolves; "
        "raise launcher.rdzv_timeout if nodes start slowly",
    )
