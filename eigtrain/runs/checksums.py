"""Content hashes of exports and checkpoints (provenance and verification record them)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


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
