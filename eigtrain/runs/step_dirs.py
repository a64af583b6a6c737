"""Step directories of a run: their names (`step-N`), the marker that makes one complete, and discovery."""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "COMPLETE"
OWNER = ".eigtrain-checkpoint"  # written first into every step directory: only those are ever deleted
_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def is_complete(path: Path) -> bool:
    return (Path(path) / MARKER).is_file()


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under ``root``, oldest first."""
    return [(s, p) for s, p in _step_dirs(root) if is_complete(p)]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = complete_checkpoints(root)
    return done[-1][1] if done else None
