"""Timing that a reviewer can trust: repeats of many steps timed by CUDA events (wall clock on the CPU), their median
and spread, and the host synchronisations a step makes (CUDA sync-debug mode). Used by tools/bench_gpu.py."""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Callable

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_repeats(step: Callable[[], None], steps: int, repeats: int, warmup: int, device: torch.device) -> list[float]:
    """Seconds per step of `repeats` runs of `steps` steps each, after `warmup` untimed steps. On CUDA the time
    between two events on the current stream: the GPU's whole span, idle gaps waiting for the host included (a
    launch-bound step shows as slow, as it should)."""
    for _ in range(warmup):
        step()
    _sync(device)
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1000.0 / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            out.append((time.perf_counter() - t0) / steps)
    return out


def summary(seconds_per_step: list[float], samples_per_step: int, views_per_sample: int = 2) -> dict:
    """Median rates and the spread over repeats: (slowest - fastest) / median, in seconds per step."""
    median = statistics.median(seconds_per_step)
    fastest, slowest = min(seconds_per_step), max(seconds_per_step)
    return {
        "seconds_per_step": median,
        "seconds_per_step_repeats": seconds_per_step,
        "spread": (slowest - fastest) / median,
        "pairs_per_s": samples_per_step / median,
        "views_per_s": views_per_sample * samples_per_step / median,
        "views_per_s_range": [
            views_per_sample * samples_per_step / slowest,
            views_per_sample * samples_per_step / fastest,
        ],
    }


def host_syncs_per_step(step: Callable[[], None], device: torch.device, steps: int = 3) -> float | None:
    """Synchronising calls per step under CUDA sync-debug mode ("warn": each one a warning); None on the CPU."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _sync(device)
    return sum("synchroniz" in str(w.message) for w in caught) / steps


def sync_sources(step: Callable[[], None], device: torch.device) -> list[str]:
    """Where one step's synchronising calls come from (file:line), for the report."""
    if device.type != "cuda":
        return []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sorted({f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)})[:10]


def driver_device_name(device: torch.device) -> dict:
    """The device as the driver names it (NVML through torch, else nvidia-smi), with the driver version."""
    if device.type != "cuda":
        return {"device": "cpu"}
    import subprocess

    info = {"device": torch.cuda.get_device_name(device)}
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        first = done.stdout.strip().splitlines()[device.index or 0] if done.returncode == 0 else ""
        if first:
            name, driver, memory, clock = (s.strip() for s in first.split(",")[:4])
            info.update(device_driver_name=name, driver=driver, memory=memory, max_sm_clock=clock)
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        pass
    return info
