"""Rank/world resolution: which launcher started this process, and its rank, world and rendezvous.

Where the ranks come from, first match wins:
1. torchrun: ``TORCHELASTIC_RUN_ID`` is set (torchrun started inside a Slurm allocation still wins:
   its RANK/WORLD_SIZE describe the processes it spawned, the SLURM_* ones only the srun task).
2. Slurm: this process is a task of an ``srun`` step (``SLURM_STEP_ID`` set). A batch or salloc shell
   has SLURM_PROCID too, but no step, and is treated as a single process.
3. torchrun-style variables set by hand (``RANK`` or ``WORLD_SIZE`` present).
4. A single process.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from eigtrain.dist.slurm_nodes import expand_nodelist, expand_tasks_per_node

log = logging.getLogger(__name__)

SLURM_PORT_BASE = 20000  # port = base + job_id % span: same on every node, differs between jobs
SLURM_PORT_SPAN = 20000
SINGLE_PROCESS_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str  # "slurm", "torchrun" or "single"


def resolve_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Rank, world and rendezvous of this process (see the module docstring for the precedence)."""
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in environ:
        return _from_torchrun(environ)
    if "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ:
        env = _from_slurm(environ)
        _check_agrees_with_torch_vars(env, environ)
        return env
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return _from_torchrun(environ)
    if int(environ.get("SLURM_NTASKS", "1")) > 1:
        log.warning(
            "SLURM_NTASKS=%s but this process was not started by srun: running as a single process",
            environ["SLURM_NTASKS"],
        )
    port = _int(environ, "MASTER_PORT") if "MASTER_PORT" in environ else SINGLE_PROCESS_PORT
    return DistEnv(0, 1, 0, 1, 0, 1, environ.get("MASTER_ADDR", "127.0.0.1"), port, "single")


def _int(environ, name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"environment variable {name}={environ[name]!r} is not an integer") from None


def _require(environ, names: list[str], source: str) -> None:
    missing = [n for n in names if n not in environ]
    if missing:
        raise ValueError(f"{source} launch detected but {', '.join(missing)} not set")


def _from_slurm(environ) -> DistEnv:
    nodelist_var = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in environ else "SLURM_JOB_NODELIST"
    _require(
        environ,
        ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_ID", nodelist_var],
        "Slurm",
    )
    rank, world = _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_NTASKS")
    local_rank, node_rank = _int(environ, "SLURM_LOCALID"), _int(environ, "SLURM_NODEID")
    hosts = expand_nodelist(environ[nodelist_var])

    # Per-node task counts; the step's own list is exact, the job's or the request are fallbacks.
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"):
        if var in environ:
            per_node = expand_tasks_per_node(environ[var])
            break
    else:
        raise ValueError("Slurm launch detected but SLURM_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE not set")
    if len(per_node) == 1:
        per_node = per_node * len(hosts)

    if len(per_node) != len(hosts):
        raise ValueError(f"{var}={environ[var]!r} describes {len(per_node)} nodes but "
                         f"{nodelist_var}={environ[nodelist_var]!r} has {len(hosts)}")
    if sum(per_node) != world:
        raise ValueError(f"{var}={environ[var]!r} sums to {sum(per_node)} tasks but SLURM_NTASKS={world}")
    if not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank} is outside [0, SLURM_NTASKS={world})")
    if not 0 <= node_rank < len(hosts):
        raise ValueError(f"SLURM_NODEID={node_rank} is outside the {len(hosts)} nodes of {nodelist_var}")
    local_world = per_node[node_rank]
    if not 0 <= local_rank < local_world:
        raise ValueError(f"SLURM_LOCALID={local_rank} is outside [0, {local_world}) tasks on node {node_rank}")

    job_id = _int(environ, "SLURM_JOB_ID")
    port = SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN
    return DistEnv(rank, world, local_rank, local_world, node_rank, len(hosts), hosts[0], port, "slurm")


def _check_agrees_with_torch_vars(env: DistEnv, environ) -> None:
    # RANK/WORLD_SIZE next to a Slurm step are either ours (exported by init_distributed) or a
    # hand-written launcher's; if they disagree, no choice is safe.
    for name, value in (("RANK", env.rank), ("WORLD_SIZE", env.world_size), ("LOCAL_RANK", env.local_rank)):
        if name in environ and environ[name] != str(value):
            raise ValueError(
                f"inconsistent launch variables: {name}={environ[name]} but Slurm says {value} "
                f"(unset {name}, or launch with torchrun, which sets TORCHELASTIC_RUN_ID)"
            )


def _from_torchrun(environ) -> DistEnv:
    names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    _require(environ, names, "torchrun")
    rank, world = _int(environ, "RANK"), _int(environ, "WORLD_SIZE")
    local_rank, local_world = _int(environ, "LOCAL_RANK"), _int(environ, "LOCAL_WORLD_SIZE")
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    if not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK={local_rank} is outside [0, LOCAL_WORLD_SIZE={local_world})")
    if world % local_world:
        raise ValueError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}")
    node_rank = _int(environ, "GROUP_RANK") if "GROUP_RANK" in environ else rank // local_world
    return DistEnv(rank, world, local_rank, local_world, node_rank, world // local_world,
                   environ["MASTER_ADDR"], _int(environ, "MASTER_PORT"), "torchrun")
