"""One writer per run directory, and readers that pruning cannot pull a checkpoint from under.

Writer: the trainer (rank 0) holds an exclusive ``flock`` on the run directory itself for the whole run and writes
its host, pid and start time into ``run_dir/.eigtrain-lock`` (which names the holder; deleting it frees nothing). A
second trainer is refused with one line naming the holder (a holder on this host that has ended is never named as
live). A holder that dies (killed, node lost) needs no clean-up: the kernel releases a flock with the last
descriptor, and forked children (data-loader workers) close theirs at once, so a restart right after a SIGKILL takes
the lock (on NFS, once the server expires the dead client's lease).

Readers (eigtrain-rr, eigtrain-eval) hold a shared ``flock`` on the step directory's ownership file (or, for old
checkpoints, its marker) while they read it; pruning deletes a step only under an exclusive, non-blocking lock of
the same file, so a step being read is kept (and pruned by a later save).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from eigtrain import safe_files

LOCK_NAME = ".eigtrain-lock"


class RunDirInUse(ValueError):
    """Another process writes this run directory (one line naming it)."""


class RunLock:
    """The writer's lock on a run directory; `release` (or the process's end) frees it.

    The lock is a ``flock`` on the run directory itself (opened read-only), so deleting or replacing
    ``.eigtrain-lock`` (which only names the holder) cannot let a second trainer in. A forked child (a data-loader
    worker) closes its copy of the descriptor at once (`os.register_at_fork`): when the trainer is killed, the lock
    goes with it, not with workers that outlive it for a while, and a restart takes it at once."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_NAME
        try:
            self._fd: int | None = lock_directory(run_dir)
        except RunDirInUse:
            raise RunDirInUse(
                f"{Path(run_dir)} is being written by another eigtrain-train ({_describe(self.path)}): one writer per "
                f"run directory; wait for it to end or choose another run_dir (a holder that died frees it by itself)"
            ) from None
        held_by = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        safe_files.write_text(self.path, json.dumps(held_by) + "\n")  # a planted link is replaced, not followed

    def release(self) -> None:
        release_directory(self._fd)
        self._fd = None


_HELD: set[int] = set()  # this process's directory locks: a forked child closes its copies


def lock_directory(path: Path) -> int:
    """An exclusive flock on directory `path` itself (its descriptor, to `release_directory`); RunDirInUse when
    another process holds it. Forked children close their copy at once (`_close_inherited_locks`)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirInUse(f"{path} is locked by another process") from None
    _HELD.add(fd)
    return fd


def release_directory(fd: int | None) -> None:
    if fd is not None:
        _HELD.discard(fd)
        os.close(fd)  # closing the last descriptor releases the flock


def _close_inherited_locks() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


class WriterSlot:
    """Context for a trainer: `take` the run directory's lock (rank 0); released when the block ends, however."""

    def __init__(self) -> None:
        self.lock: RunLock | None = None

    def take(self, run_dir: Path) -> str:
        """'' once held, or the one line naming the holder."""
        try:
            self.lock = RunLock(run_dir)
        except RunDirInUse as refusal:
            return str(refusal)
        return ""

    def __enter__(self) -> "WriterSlot":
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.lock.release()


def _describe(path: Path) -> str:
    """The holder named in `path`, if that file says; a holder on this host that has ended is not named as live."""
    try:
        info = json.loads(path.read_text(errors="replace"))
        where = f"host {info['host']}, pid {info['pid']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
    if info["host"] == socket.gethostname() and not _alive(int(info["pid"])):
        return f"a process that started it has ended ({where}); another holds the lock"
    return where


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _pin_file(step: Path) -> Path | None:
    from eigtrain.runs.step_dirs import MARKER, OWNER

    for name in (OWNER, MARKER):
        if (Path(step) / name).is_file():
            return Path(step) / name
    return None


@contextlib.contextmanager
def pinned(step: Path) -> Iterator[bool]:
    """Hold a shared lock on checkpoint `step` while reading it; yields whether it is still complete once pinned (a
    pruner may have deleted it meanwhile: then read another). A step whose files cannot be opened for locking (a
    read-only copy nobody prunes) is read unpinned."""
    from eigtrain.runs.step_dirs import is_complete

    file = _pin_file(step)
    try:
        fd = os.open(file, os.O_RDONLY) if file else None
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits for a pruner deleting it, which then leaves it incomplete
        yield is_complete(step)
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def unpinned(step: Path) -> Iterator[bool]:
    """For the pruner: yields whether no reader pins `step`, holding it against new readers meanwhile."""
    file = _pin_file(step)
    if file is None:
        yield True
        return
    fd = os.open(file, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
