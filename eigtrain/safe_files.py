"""Every file eigtrain writes goes through here: whole or not at all, and never through a planted link.

A write goes to a fresh temporary file in the target's own directory (created with O_EXCL | O_NOFOLLOW, so no
existing name, link or not, is ever opened for writing), is flushed and fsynced, then renamed over the target. A
rename replaces a symbolic link at the target rather than following it, so a link planted where eigtrain writes
(``run_dir/eval/table.md -> ~/.bashrc``) is replaced by the file and its victim stays untouched; readers see the old
file or the new one, never a part. A full disk or a file-size limit (ENOSPC, EDQUOT, EFBIG, SIGXFSZ ignored) is one
`OutputError` naming the path, and the temporary file is removed.

`make_dir` creates an output directory and refuses one that is a symbolic link (a directory eigtrain creates
inside an output it was told to write must not be redirected elsewhere by whoever prepared that output).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

_SPACE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DEFAULT_MODE = 0o644


class OutputError(OSError):
    """A file eigtrain was writing could not be written whole; its message is one line naming the path."""

    def __str__(self) -> str:  # the line itself, without OSError's "[Errno N]" prefix
        return self.strerror or super().__str__()


def _explain(path: Path, error: OSError) -> OutputError:
    if error.errno == errno.ELOOP:
        return OutputError(
            errno.ELOOP,
            f"cannot write {path}: it is a symbolic link (eigtrain does not write through links in its outputs); "
            "remove it or name another directory",
        )
    if error.errno in _SPACE_ERRORS:
        cause = "the disk is full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "the file size limit is reached"
        return OutputError(
            error.errno, f"cannot write {path}: {cause} ({os.strerror(error.errno or 0)}); nothing was written there"
        )
    return OutputError(error.errno, f"cannot write {path}: {error.strerror or error}")


def _ignore_file_size_signal() -> None:
    """Past `ulimit -f` the kernel sends SIGXFSZ, whose default action kills the process with no message; ignored,
    the write fails with EFBIG instead and is reported as one line. Only the main thread may set a handler."""
    with contextlib.suppress(ValueError, AttributeError, OSError):
        if signal.getsignal(signal.SIGXFSZ) == signal.SIG_DFL:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{12}\.tmp")


def temporary_of(name: str) -> str | None:
    """The name a temporary file of ours (left by a killed write) was to become, else None: an output directory
    holding it still holds only eigtrain's files."""
    match = _TEMPORARY.fullmatch(name)
    return match[1] if match else None


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot open or fsync a directory; the rename still holds
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _create_temporary(path: Path, mode: int) -> tuple[Path, int]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        tmp = _temporary_name(path)
        try:
            return tmp, os.open(tmp, flags, mode)
        except FileExistsError:
            continue
        except OSError as error:
            raise _explain(path, error) from error
    raise OutputError(errno.EEXIST, f"cannot write {path}: no free temporary name beside it")


def _commit(tmp: Path, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        raise OutputError(errno.EISDIR, f"cannot write {path}: a directory is there")
    os.replace(tmp, path)  # replaces a symbolic link at `path` itself; never writes through it
    _fsync_directory(path.parent)


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike, mode: str = "w", *, file_mode: int = _DEFAULT_MODE, **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """A file object for writing `path` whole: ``with atomic_open(p) as f: f.write(...)``. `mode` is "w" or "wb";
    `file_mode` the permission bits (0o600 for anything that could hold a secret); on any exception the target is
    left as it was."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole file: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    _ignore_file_size_signal()
    tmp, fd = _create_temporary(path, file_mode)
    with _removed_on_failure(tmp, path):
        with os.fdopen(fd, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, file_mode)  # the umask narrowed the creation mode; the caller's bits are the intent
        _commit(tmp, path)


@contextlib.contextmanager
def _removed_on_failure(tmp: Path, path: Path) -> Iterator[None]:
    """Whatever fails inside, the temporary file goes; an OSError (or a library's wrapped full-disk error) becomes
    the `OutputError` naming `path`."""
    try:
        yield
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(error, OutputError):
            raise
        if isinstance(error, OSError):
            raise _explain(path, error) from error
        if _is_space_error(error):  # safetensors and others wrap the OSError in their own exception
            raise OutputError(
                errno.ENOSPC,
                f"cannot write {path}: the disk is full or the file size limit is reached; nothing was written there",
            ) from error
        raise


def write_bytes(path: str | os.PathLike, data: bytes, *, file_mode: int = _DEFAULT_MODE) -> None:
    with atomic_open(path, "wb", file_mode=file_mode) as handle:
        handle.write(data)


def write_text(path: str | os.PathLike, text: str, *, file_mode: int = _DEFAULT_MODE) -> None:
    with atomic_open(path, "w", file_mode=file_mode, encoding="utf-8") as handle:
        handle.write(text)


def write_with(path: str | os.PathLike, writer: Callable[[Path], Any], *, file_mode: int = _DEFAULT_MODE) -> None:
    """For libraries that write to a path themselves (safetensors' save_file, torch.save, matplotlib's savefig,
    numpy's save): `writer(tmp)` writes a temporary path beside `path`, which is then fsynced and renamed into place.
    The temporary name ends in ``.tmp``; a writer that appends its own suffix (numpy adds ``.npy``) is not
    supported."""
    path = Path(path)
    _ignore_file_size_signal()
    tmp, fd = _create_temporary(path, file_mode)
    os.close(fd)
    with _removed_on_failure(tmp, path):
        writer(tmp)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, file_mode)
        _commit(tmp, path)


def _is_space_error(error: BaseException) -> bool:
    text = str(error)
    return any(
        word in text
        for word in ("No space left", "File too large", "Disk quota", "os error 28", "os error 27", "os error 122")
    )


def open_descriptor(path: str | os.PathLike, flags: int, *, file_mode: int = _DEFAULT_MODE) -> int:
    """os.open for the files eigtrain keeps open and writes in place (a lock, an appended log): created if missing,
    never through a symbolic link at `path` (O_NOFOLLOW: refused in one line naming it)."""
    path = Path(path)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), file_mode)
    except OSError as error:
        raise _explain(path, error) from error


def refuse_link(path: str | os.PathLike) -> None:
    """OutputError (one line) when `path` is a symbolic link: for a file eigtrain reads back and rewrites."""
    if Path(path).is_symlink():
        raise _explain(Path(path), OSError(errno.ELOOP, os.strerror(errno.ELOOP)))


def open_append(path: str | os.PathLike, *, file_mode: int = _DEFAULT_MODE) -> IO[str]:
    """A text log eigtrain appends to line by line (metrics.jsonl), opened by `open_descriptor`."""
    _ignore_file_size_signal()
    return os.fdopen(open_descriptor(path, os.O_WRONLY | os.O_APPEND, file_mode=file_mode), "a", encoding="utf-8")


def one_line(value: object) -> str:
    """`value` as text for a report line: control characters (newlines included) escaped, so a value read from
    someone's config (``data.root``) stays inside its line and cannot add lines to a file that is later sourced."""
    text = str(value)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def make_dir(path: str | os.PathLike, *, mode: int = 0o755) -> Path:
    """Create `path` (and missing parents) for eigtrain's own output; refuse a symbolic link at `path` itself."""
    path = Path(path)
    if path.is_symlink():
        raise OutputError(
            errno.ELOOP,
            f"cannot write into {path}: it is a symbolic link (eigtrain does not write "
            "through links inside its outputs); remove it or name another directory",
        )
    try:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
    except OSError as error:
        raise _explain(path, error) from error
    if not path.is_dir():
        raise OutputError(errno.ENOTDIR, f"cannot write into {path}: it is not a directory")
    return path
