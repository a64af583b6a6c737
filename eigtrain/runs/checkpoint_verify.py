"""Checksums of a checkpoint's files: written at save (before the COMPLETE marker), checked before any load.

``checksums.json`` maps each file of ``step-N/`` (but the ownership file, the marker and itself) to its sha256. A
step whose files do not match -- a bit flipped, a file truncated, emptied or gone -- is skipped with one line naming
the file, and the trainer, eigtrain-rr and eigtrain-eval take the newest step that verifies. A step whose marker
does not announce checksums (written before them) is read unverified, as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eigtrain import safe_files
from eigtrain.runs.checkpoint_read import CheckpointReadError
from eigtrain.runs.checksums import file_sha256

log = logging.getLogger("eigtrain.runs.checkpoint")

CHECKSUMS = "checksums.json"


def write_checksums(path: Path, skip: tuple[str, ...]) -> str:
    """Hash every file under `path` (but `skip`'s names) into CHECKSUMS, atomically and durably; returns its name."""
    path = Path(path)
    files = {
        str(p.relative_to(path)): file_sha256(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.name not in (*skip, CHECKSUMS) and not p.name.endswith(".tmp")
    }
    # the file under its name, and the rename, durable before the marker (safe_files fsyncs both)
    safe_files.write_text(path / CHECKSUMS, json.dumps({"algorithm": "sha256", "files": files}, indent=1))
    return CHECKSUMS


def verify(path: Path, marker: dict) -> str:
    """'' when every file `marker` (the step's COMPLETE, read) vouches for is whole; else one line naming the file."""
    path = Path(path)
    name = marker.get("checksums")
    if not name:  # a checkpoint from before checksums: nothing to check it against
        return ""
    if not isinstance(name, str) or Path(name).name != name:
        return f"its COMPLETE marker names no checksum file of the step ({name!r})"
    listing = path / name
    try:
        files = json.loads(listing.read_text())["files"]
        if not isinstance(files, dict):
            raise ValueError("no file list")
    except (OSError, ValueError, KeyError, TypeError) as error:
        return str(CheckpointReadError(listing, error))
    for name, expected in files.items():
        file = path / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{listing} names {name!r}, outside the checkpoint"
        try:
            actual = file_sha256(file)
        except OSError as error:
            return str(CheckpointReadError(file, error.strerror or error))
        if actual != expected:
            return f"{file} does not match the checksum written when it was saved (corrupt or truncated)"
    return ""


def read_marker(path: Path) -> dict | None:
    """The step's COMPLETE marker as a dict, or None when it cannot be read (then the step is not complete)."""
    from eigtrain.runs.step_dirs import MARKER

    try:
        marker = json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def check_step(path: Path) -> None:
    """Refuse (CheckpointReadError, one line) a step directory that is not complete or does not verify."""
    from eigtrain.runs.step_dirs import MARKER

    marker = read_marker(path)
    if marker is None:
        raise CheckpointReadError(
            Path(path) / MARKER, "the checkpoint is not complete (its save did not finish): it is never read"
        )
    if problem := verify(path, marker):
        raise ValueError(f"checkpoint {path} fails verification: {problem}")


def newest_verified(root: Path) -> Path | None:
    """The newest complete checkpoint under `root` that verifies; each newer one that does not is skipped with one
    warning naming its file."""
    from eigtrain.runs.lock import pinned
    from eigtrain.runs.step_dirs import complete_checkpoints

    for _, path in reversed(complete_checkpoints(root)):
        with pinned(path) as present:  # hashed while pinned: a trainer's pruning cannot delete it mid-hash
            if not present:  # pruned since it was listed: a newer one exists, or the one before serves
                continue
            marker = read_marker(path)
            problem = "its COMPLETE marker cannot be read" if marker is None else verify(path, marker)
        if not problem:
            return path
        log.warning("skipping checkpoint %s: %s; trying the one before", path, problem)
    return None


def record_file(directory: Path, name: str) -> None:
    """Add `name`'s sha256 to `directory`/CHECKSUMS (what eigtrain wrote there: a run directory's model.safetensors),
    so that readers can verify it (`recorded_mismatch`)."""
    listing = Path(directory) / CHECKSUMS
    files = _recorded(listing) or {}
    files[name] = file_sha256(Path(directory) / name)
    safe_files.write_text(listing, json.dumps({"algorithm": "sha256", "files": files}, indent=1))


def recorded_mismatch(directory: Path, name: str) -> str:
    """'' when `directory`/`name` matches the sha256 recorded for it (or none was: a run from before records), else
    why not, in words naming the file."""
    recorded = (_recorded(Path(directory) / CHECKSUMS) or {}).get(name)
    if recorded is None:
        return ""
    try:
        actual = file_sha256(Path(directory) / name)
    except OSError as error:
        return f"{Path(directory) / name} cannot be read ({error.strerror or error})"
    if actual != recorded:
        return f"{Path(directory) / name} does not match the sha256 recorded when eigtrain wrote it (changed since)"
    return ""


def _recorded(listing: Path) -> dict | None:
    try:
        files = json.loads(listing.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return files if isinstance(files, dict) else None
