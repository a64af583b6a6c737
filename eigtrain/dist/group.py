"""The process group and the few collectives every command shares; the device and CPU threads each process
computes with."""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from eigtrain.dist.env import DistEnv, resolve_env


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


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch's intra-op threads set to `count` while the block runs (None: as they are), then as they were: a
    caller's process (tests, tools) keeps its own setting."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
