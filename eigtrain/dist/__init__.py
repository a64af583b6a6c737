"""Distributed launch, one implementation for Slurm, torchrun and single runs, in rooms with one job each:

- `env`: which launcher started this process and its rank, world and rendezvous (`resolve_env`, `DistEnv`);
- `slurm_nodes`: Slurm's compressed node and task-count lists (scontrol where it serves, a parser otherwise);
- `group`: the process group, the shared collectives and the device of each process;
- `signals`: save-on-signal flags, agreed across ranks at step boundaries.

Callers import from `eigtrain.dist` only; the names below are its public surface.
"""

from eigtrain.dist.env import SINGLE_PROCESS_PORT, SLURM_PORT_BASE, SLURM_PORT_SPAN, DistEnv, resolve_env
from eigtrain.dist.group import (
    all_ranks_any,
    backend_for,
    barrier,
    broadcast_object,
    destroy,
    init_distributed,
    is_rank_zero,
    select_device,
    torch_threads,
)
from eigtrain.dist.signals import (
    _StopState,
    install_stop_handler,
    leave_after_stop,
    requeue_requested,
    stop_at_step_boundary,
    stop_requested,
    stop_signal,
    stopped,
)
from eigtrain.dist.slurm_nodes import expand_nodelist, expand_tasks_per_node

__all__ = [
    "SINGLE_PROCESS_PORT", "SLURM_PORT_BASE", "SLURM_PORT_SPAN", "DistEnv", "resolve_env", "all_ranks_any",
    "backend_for", "barrier", "broadcast_object", "destroy", "init_distributed", "is_rank_zero", "select_device",
    "torch_threads",
    "install_stop_handler", "requeue_requested", "stop_requested", "stopped", "expand_nodelist",
    "stop_at_step_boundary", "stop_signal", "leave_after_stop",
    "expand_tasks_per_node",
]
