"""Content hashes of exports and checkpoints (provenance and verification record them)."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future
from pathlib import Path

_AHEAD: dict[str, Future] = {}  # hash_ahead's, by real path, until path_sha256 takes it


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def files_sha256(directory: str | os.PathLike) -> str:
    """Hash of every file under a directory: relative names and content hashes, in name order."""
    root = Path(directory)
    digest = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(root)}:{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def path_sha256(path: str | os.PathLike) -> str:
    """`files_sha256` of a directory, else `file_sha256`; the result of this path's `hash_ahead` when one started."""
    future = _AHEAD.pop(os.path.realpath(path), None)
    if future is not None:
        return future.result()
    return files_sha256(path) if Path(path).is_dir() else file_sha256(path)


def hash_ahead(path: str | os.PathLike) -> None:
    """Start `path_sha256(path)` in a daemon thread now, e.g. while torch is imported (one core idle: hashlib
    releases the GIL); `path_sha256` of the same path takes its result (or its error). A later call replaces an
    earlier one no `path_sha256` took (a command that stopped before reading its files: they may have changed)."""
    key = os.path.realpath(path)
    future: Future = Future()

    def work() -> None:
        try:
            future.set_result(files_sha256(key) if Path(key).is_dir() else file_sha256(key))
        except BaseException as error:  # noqa: BLE001 - raised where the hash is taken
            future.set_exception(error)

    _AHEAD[key] = future
    threading.Thread(target=work, name="eigtrain-hash-ahead", daemon=True).start()
