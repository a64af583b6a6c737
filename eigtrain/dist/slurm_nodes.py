"""Slurm's compressed node and task-count lists, expanded.

The node list is expanded by Slurm itself (`scontrol show hostnames`) where scontrol is on PATH and can read its
configuration, so that whatever grammar the installed Slurm writes is read by the same Slurm; the parser below is
the fallback (no scontrol, or scontrol without a slurm.conf, e.g. outside a cluster) and gives the clear errors.
"""

from __future__ import annotations

import re
import shutil
import subprocess

SCONTROL_TIMEOUT_S = 10  # a local hostlist operation; a hung config lookup must not stall start-up


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list, e.g. "gpu[01-03,07],cpu5,a[1-2]-ib" (zero padding kept)."""
    return scontrol_hostnames(nodelist) or parse_nodelist(nodelist)


def scontrol_hostnames(nodelist: str) -> list[str] | None:
    """Slurm's own expansion of `nodelist`, or None where scontrol is missing, fails or rejects the list.

    scontrol exits 0 even on a list it cannot read (it says "Invalid hostlist" on stderr and prints nothing),
    so only a clean stderr and a non-empty answer count.
    """
    scontrol = shutil.which("scontrol")
    if scontrol is None or not nodelist:
        return None
    try:
        done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    hosts = done.stdout.split()
    return hosts if done.returncode == 0 and not done.stderr.strip() and hosts else None


def parse_nodelist(nodelist: str) -> list[str]:
    """The fallback expansion (Slurm's grammar: comma-separated groups, bracketed ranges, any literal suffix)."""
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
