"""Will this Slurm job ever start? Checked against the partition's nodes before submitting, and read from the
pending reason while waiting, so that a request no node can hold ends with one line instead of waiting for ever.

Slurm accepts a job that asks more than any node of its partition has (its default EnforcePartLimits=NO) and keeps
it PENDING with reason PartitionConfig: e.g. 2 tasks x 2 CPUs on a 2-CPU node.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from eigtrain.schema import ConfigError, SlurmLauncherConfig

# Pending reasons after which the job cannot start without an administrator changing the cluster or the job
NEVER_REASONS = {
    "PartitionConfig": "it asks more than the partition's nodes have (CPUs, memory, GPUs or nodes)",
    "PartitionNodeLimit": "it asks more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is longer than the partition's (launcher.time)",
    "BadConstraints": "no node of the partition has its constraints (launcher.constraint)",
    "InvalidAccount": "its account is not valid (launcher.account)",
    "InvalidQOS": "its QOS is not valid (launcher.qos)",
}
UNAVAILABLE_STATES = ("down", "drain", "fail", "maint", "inval", "future")  # sinfo's node states, prefixes


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    state: str


def partition_nodes(partition: str | None) -> tuple[str, list[Node]] | None:
    """(partition name, its nodes) as `sinfo` tells them; the default partition when `partition` is None; None
    where sinfo is missing or fails (nothing is checked then)."""
    if shutil.which("sinfo") is None:
        return None
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G|%t"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return None
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 5]
    names = {p.rstrip("*") for _, p, *_ in rows}
    if partition is None:
        partition = next((p.rstrip("*") for _, p, *_ in rows if p.endswith("*")), None)
        if partition is None:
            return None  # no default partition: sbatch itself says so
    if partition not in names:
        raise ConfigError(
            f"launcher.partition={partition!r} is not a partition of this cluster; "
            f"partitions: {', '.join(sorted(names))}"
        )
    nodes = [
        Node(n, int(c), int(re.sub(r"\D.*", "", m) or 0), _gpus(g), s)
        for n, p, c, m, g, s in rows
        if p.rstrip("*") == partition
    ]
    return partition, nodes


def _gpus(gres: str) -> int:
    """GPUs of a node's Gres string: 'gpu:8', 'gpu:a100:4(S:0-1),gpu:v100:2' -> 8, 6; '(null)' -> 0."""
    return sum(int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))


def size_mb(value, unit_gb: bool = True) -> int | None:
    """Slurm memory sizes: a number (GB, as launcher.mem / mem_per_cpu take them) or '4096M', '64G', '1T'."""
    if value is None:
        return None
    if not isinstance(value, str):
        return int(float(value) * 1024) if unit_gb else int(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", value.upper())
    if not match:
        return None
    scale = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024**2}[match.group(2)]
    return int(float(match.group(1)) * scale)


def check_fits(c: SlurmLauncherConfig) -> None:
    """ConfigError, one line naming the keys, when no `c.nodes` nodes of the partition can ever hold one node's
    share of the job (tasks_per_node x cpus_per_task CPUs, their memory, gpus_per_node GPUs)."""
    found = partition_nodes(c.partition)
    if found is None:
        return
    partition, nodes = found
    cpus = c.tasks_per_node * (c.cpus_per_task or 1)
    memory = (
        size_mb(c.mem)
        if c.mem is not None
        else (None if size_mb(c.mem_per_cpu) is None else size_mb(c.mem_per_cpu) * cpus)
    )
    ask = (
        f"{c.tasks_per_node} task(s) x {c.cpus_per_task or 1} CPU(s) = {cpus} CPUs"
        + (f", {memory} MB" if memory else "")
        + (f", {c.gpus_per_node} GPU(s)" if c.gpus_per_node else "")
    )
    fitting = [
        n
        for n in nodes
        if n.cpus >= cpus and (not memory or not n.memory_mb or n.memory_mb >= memory) and n.gpus >= c.gpus_per_node
    ]
    if len(fitting) >= c.nodes:
        return
    best = max(nodes, key=lambda n: (n.cpus, n.memory_mb, n.gpus), default=None)
    has = (
        "no nodes"
        if best is None
        else (
            f"{len(fitting)} node(s) that can hold it (the largest has {best.cpus} CPUs, {best.memory_mb} MB, "
            f"{best.gpus} GPU(s))"
        )
    )
    raise ConfigError(
        f"this Slurm job could never start: it asks {c.nodes} node(s) of {ask} each, and partition {partition!r} "
        f"has {has}; lower launcher.tasks_per_node, launcher.cpus_per_task (default data.num_workers + 1), "
        f"launcher.mem / mem_per_cpu or launcher.nodes, or pick another launcher.partition"
    )


def never_starts(fields: dict[str, str]) -> str | None:
    """Why a PENDING job (`scontrol show job -o` fields) can never start; None while it may still start."""
    if fields.get("JobState") != "PENDING":
        return None
    reason = fields.get("Reason", "")
    key = reason.split(",")[0]
    if key in NEVER_REASONS:
        return f"{key}: {NEVER_REASONS[key]}"
    if key == "ReqNodeNotAvail":  # also given for nodes reserved for a while: final only when they are down
        listed = re.search(r"UnavailableNodes:(\S*)", reason)
        down = _unavailable(listed.group(1) if listed else "")
        if down:
            return f"ReqNodeNotAvail: the nodes it needs are {down}"
    return None


def _unavailable(node_list: str) -> str | None:
    """'node1 down, node2 drain' when every node of the Slurm node list is down, drained or failed."""
    if not node_list or shutil.which("sinfo") is None:
        return None
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node_list, "-o", "%N|%t"], capture_output=True, text=True, timeout=60
    )
    states = dict(line.split("|", 1) for line in out.stdout.split() if "|" in line)
    if not states or not all(s.startswith(UNAVAILABLE_STATES) for s in states.values()):
        return None
    return ", ".join(f"{n} {s}" for n, s in sorted(states.items()))
