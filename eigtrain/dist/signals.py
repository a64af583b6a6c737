"""Save-on-signal: the handler only sets a flag; the trainer agrees on it across ranks at a step boundary
(`stop_requested`), never inside the handler, where no I/O or collective is safe."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

import torch.distributed as dist

from eigtrain.dist.group import all_ranks_any


class _StopState:
    installed = False
    received: set[int] = set()  # signals seen by this rank's handler
    requeue_signal: int | None = None
    stopped = False  # agreed across ranks by stop_requested()
    requeue = False
    twice_kills: tuple[int, ...] = ()  # signals that, given a second time, end the process at once


def install_stop_handler(requeue_signal: int | None = signal.SIGUSR2,
                         stop_signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
    """Turn the given signals into a stop request checked at the next step boundary.

    `requeue_signal` (Slurm's pre-timeout signal, USR2 for submitit) also asks the launcher to
    requeue the job after the save; `stop_signals` (SIGTERM: preemption, scancel, the time limit
    itself) only save: Slurm decides whether the job comes back. Install on all ranks or on none.
    """

    def on_signal(signum, frame):  # only sets a flag: no I/O, no collective here
        if signum in _StopState.received and signum in _StopState.twice_kills:  # asked again: leave at once
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
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


@contextlib.contextmanager
def stop_at_step_boundary(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
    """Outside Slurm (the local launcher, torchrun): for the duration, `signals` (SIGHUP: the terminal closed) stop
    the trainer at the next step
    boundary, where it saves, as under Slurm; the same signal a second time ends the process at once (an impatient
    Ctrl-C). The process's own handlers are back afterwards. Only the main thread can install handlers: elsewhere
    (a test runner's thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signals}
    install_stop_handler(requeue_signal=None, stop_signals=signals)
    _StopState.twice_kills = signals
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _StopState.installed, _StopState.twice_kills = False, ()


def stop_signal() -> signal.Signals | None:
    """The stop signal this process received (the lowest-numbered, if several), None if none."""
    return signal.Signals(min(_StopState.received)) if _StopState.received else None


def leave_after_stop(command: str, step: int, checkpoint) -> None:
    """After a stop signal and the save at the step boundary: one line (rank 0), then the exit status a shell gives a
    process ended by that signal (128 + its number): not a success, and no traceback."""
    from eigtrain.dist.env import resolve_env

    signum = stop_signal() or signal.SIGTERM
    if resolve_env().rank == 0:
        print(
            f"{command}: stopped by {signum.name} at step {step}; saved {checkpoint}; run the same command again "
            f"to resume",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(128 + signum)
