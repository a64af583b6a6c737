"""Reads that cannot hang: every read of a ``pipe:`` command or an object-store file returns within a timeout.

HTTP reads are bounded by the socket timeout (`urlopen(..., timeout=)`); the other remote sources block in code
that has no timeout of its own (a pipe's ``read()``, fsspec backends), so here each read runs in a helper thread
and a read that gets no answer within `timeout_s` aborts the source (kills the pipe's command, closes the file)
and raises `TimeoutError` naming the URL and the key that sets the bound.
"""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import threading
from typing import Any, Callable

TIMEOUT_KEY = "data.io_timeout_s"
BUFFER_BYTES = 1 << 20  # one thread hand-off per MiB read, not per tar record


def call_within(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`fn()` in a daemon thread; `TimeoutError` naming `what` when it takes longer than `timeout_s`.
    (A daemon thread: one stuck for good in a backend never keeps the interpreter from exiting.)"""
    answer: queue.Queue = queue.Queue(maxsize=1)

    def work():
        try:
            answer.put((True, fn()))
        except BaseException as exn:  # handed to the caller's thread
            answer.put((False, exn))

    threading.Thread(target=work, daemon=True, name="bounded-io").start()
    try:
        ok, value = answer.get(timeout=timeout_s)
    except queue.Empty:
        raise TimeoutError(f"no answer from {what} within {timeout_s:g} s ({TIMEOUT_KEY})") from None
    if not ok:
        raise value
    return value


class _BoundedRaw(io.RawIOBase):
    """A blocking binary stream whose every read ends within `timeout_s`; on a stall `abort()` unblocks the source
    and the read raises `TimeoutError`. `at_end()` runs once the source is exhausted (a pipe's exit status)."""

    def __init__(
        self,
        source,
        timeout_s: float,
        url: str,
        abort: Callable[[], None],
        at_end: Callable[[], None] = lambda: None,
        on_close: Callable[[], None] = lambda: None,
    ):
        self.source, self.timeout_s, self.url = source, timeout_s, url
        self._abort, self._at_end, self._on_close = abort, at_end, on_close

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = call_within(lambda: self.source.read(len(buffer)), self.timeout_s, self.url)
        except TimeoutError:
            self._abort()
            raise
        if not data:
            self._at_end()
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._on_close()
            finally:
                super().close()


def bounded(source, timeout_s: float, url: str) -> io.BufferedReader:
    """A file object (fsspec, webdataset's gopen) with every read bounded by `timeout_s`."""

    def shut():
        try:
            source.close()
        except Exception:  # closing a stalled backend may fail; the read already names the stall
            pass

    return io.BufferedReader(_BoundedRaw(source, timeout_s, url, abort=shut, on_close=shut), BUFFER_BYTES)


def open_pipe(url: str, timeout_s: float) -> io.BufferedReader:
    """The stdout of the shell command of ``pipe:CMD`` (it runs a shell command, as webdataset's pipe: does),
    every read bounded; a command that exits with a non-zero status makes the read fail naming it, so a cut
    transfer (``curl`` failing midway) is never taken for a complete shard."""
    command = url[len("pipe:") :]
    proc = subprocess.Popen(
        command, shell=True, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, bufsize=0, start_new_session=True
    )  # unbuffered: a read returns what the pipe holds, not 1 MiB

    def kill():  # the command's whole process group (started as a session): the shell's children too
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()

    def exit_status():
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # stdout closed, but the command does not end
            kill()
            raise TimeoutError(f"the command of {url} did not exit within {timeout_s:g} s ({TIMEOUT_KEY})") from None
        if status != 0:
            raise OSError(f"the command of {url} exited with status {status}")

    def close():
        proc.stdout.close()
        kill()  # read to the end: long gone; closed early by the reader: not needed any more

    return io.BufferedReader(
        _BoundedRaw(proc.stdout, timeout_s, url, abort=kill, at_end=exit_status, on_close=close), BUFFER_BYTES
    )
