"""Rank/world resolution and process groups: the one implementation for Slurm, torchrun and single runs.

Where the ranks come from, first match wins:
1. torchrun: ``TORCHELASTIC_RUN_ID`` is set (torchrun started inside a Slurm allocation still wins:
   its RANK/WORLD_SIZE describe the processes it spawned, the SLURM_* ones only the srun task).
2. Slurm: this process is a task of an ``srun`` step (``SLURM_STEP_ID`` set). A batch or salloc shell
   has SLURM_PROCID too, but no step, and is treated as a single process.
3. torchrun-style variables set by hand (``RANK`` or ``WORLD_SIZE`` present).
4. A single process.

Save-on-signal lives here too (`install_stop_handler`, `stop_requested`): the handler only sets a flag;
the trainer agrees on it across ranks at a step boundary, never inside the handler.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

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


# ----------------------------------------------------------------------------------------------
# Resolution


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list, e.g. "gpu[01-03,07],cpu5,a[1-2]-ib" (zero padding kept)."""
    hosts: list[str] = []
    for group in _split_top_level(nodelist, what="node list"):
        # "a[1-2]-ib[3,5]" splits into literals and bracket contents: ["a", "1-2", "-ib", "3,5", ""]
        pieces = re.split(r"\[([^\[\]]*)\]", group)
        names = [pieces[0]]
        for ranges, literal in zip(pieces[1::2], pieces[2::2]):
            names = [n + s + literal for n in names for s in _expand_ranges(ranges, nodelist)]
        hosts.extend(names)
    if not hosts:
        raise ValueError(f"empty Slurm node list {nodelist!r}")
    return hosts


def _split_top_level(s: str, what: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(s):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in Slurm {what} {s!r}")
        if c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced brackets in Slurm {what} {s!r}")
    parts.append(s[start:])
    if any(not p.strip() for p in parts):
        raise ValueError(f"empty entry in Slurm {what} {s!r}")
    return [p.strip() for p in parts]


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    out = []
    for item in ranges.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in Slurm node list {whole!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in Slurm node list {whole!r}")
        out += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    return out


def expand_tasks_per_node(spec: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE, e.g. "4(x2),3" -> [4, 4, 3]."""
    counts = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise ValueError(f"bad Slurm tasks-per-node value {spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


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


# ----------------------------------------------------------------------------------------------
# Process group


def init_distributed(env: DistEnv | None = None, backend: str | None = None, timeout_s: float = 600) -> DistEnv:
    """Export the launch variables, pick the device and create the process group.

    Call before data loader workers start, so they inherit RANK/WORLD_SIZE. With one process no
    group is created. Collectives that wait longer than `timeout_s` (a dead or stuck rank) raise.
    """
    env = env or resolve_env()
    os.environ.update(
        RANK=str(env.rank), WORLD_SIZE=str(env.world_size), LOCAL_RANK=str(env.local_rank),
        LOCAL_WORLD_SIZE=str(env.local_world_size), MASTER_ADDR=env.master_addr,
        MASTER_PORT=str(env.master_port),
    )
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = select_device(env, "cuda") if "nccl" in backend else None
    if env.world_size == 1 or dist.is_initialized():
        return env
    dist.init_process_group(
        backend, init_method="env://", rank=env.rank, world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s), device_id=device,
    )
    return env


def backend_for(device: torch.device) -> str:
    """The process-group backend for a job computing on `device`: gloo on the CPU; on CUDA, NCCL for CUDA tensors
    and gloo beside it for the CPU tensors such a job also reduces (float64 accumulators, flags)."""
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def select_device(env: DistEnv, kind: str = "auto") -> torch.device:
    """This process's device, chosen here for every command (train, Rayleigh-Ritz, evaluation) so that they agree.

    kind: auto (this task's GPU when one is visible, else the CPU) | cpu | cuda | an explicit torch device string.
    The GPU is LOCAL_RANK's, or device 0 when the launcher binds one GPU per task (Slurm --gpus-per-task=1);
    it also becomes the current CUDA device (NCCL, new tensors on "cuda").
    """
    if kind not in ("auto", "cpu", "cuda"):
        device = torch.device(kind)
    elif kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    elif not torch.cuda.is_available():
        raise ValueError("device=cuda but no GPU is visible; use device=auto or device=cpu")
    else:
        device = torch.device("cuda", _cuda_device_index(env))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _cuda_device_index(env: DistEnv) -> int:
    count = torch.cuda.device_count()
    if count == 1:  # one GPU bound per task (e.g. --gpus-per-task=1): it is device 0
        return 0
    if env.local_rank >= count:
        raise ValueError(f"LOCAL_RANK={env.local_rank} but only {count} GPUs are visible on this node: "
                         "tasks_per_node must not exceed gpus_per_node")
    return env.local_rank


def is_rank_zero() -> bool:
    if dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """`obj` from rank `src` on every rank (rank 0 decides run dir, resume step, run ids)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_ranks_any(*flags: bool) -> list[bool]:
    """For each flag: True on every rank if it is True on any rank (a collective: call on all ranks)."""
    if not dist.is_initialized():
        return list(flags)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    t = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------
# Save-on-signal


class _StopState:
    installed = False
    received: set[int] = set()  # signals seen by this rank's handler
    requeue_signal: int | None = None
    stopped = False  # agreed across ranks by stop_requested()
    requeue = False


def install_stop_handler(requeue_signal: int | None = signal.SIGUSR2,
                         stop_signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
    """Turn the given signals into a stop request checked at the next step boundary.

    `requeue_signal` (Slurm's pre-timeout signal, USR2 for submitit) also asks the launcher to
    requeue the job after the save; `stop_signals` (SIGTERM: preemption, scancel, the time limit
    itself) only save: Slurm decides whether the job comes back. Install on all ranks or on none.
    """

    def on_signal(signum, frame):  # only sets a flag: no I/O, no collective here
        _StopState.received.add(signum)

    _StopState.received, _StopState.stopped, _StopState.requeue = set(), False, False
    for sig in (*stop_signals, *([requeue_signal] if requeue_signal is not None else [])):
        signal.signal(sig, on_signal)
    _StopState.installed, _StopState.requeue_signal = True, requeue_signal


def stop_requested(poll: bool = True) -> bool:
    """Whether any rank got a stop signal; the same answer on every rank. Call at step boundaries on
    all ranks (one small all-reduce when a handler is installed, free otherwise). Once True, stays True.
    With several ranks only a call with `poll` (the same on every rank) asks the others: the all-reduce and
    its read-back wait for the GPU queue, so the trainer polls every few steps, not at each one."""
    if not _StopState.installed:
        return False
    if _StopState.stopped:
        return True
    if not poll and dist.is_initialized():
        return False
    got = _StopState.received
    _StopState.stopped, _StopState.requeue = all_ranks_any(bool(got), _StopState.requeue_signal in got)
    return _StopState.stopped


def stopped() -> bool:
    """Whether `stop_requested()` has returned True (no collective)."""
    return _StopState.stopped


def requeue_requested() -> bool:
    """After `stop_requested()` returned True: whether the stop came with a request to requeue."""
    return _StopState.requeue
