"""The JSON manifests eigtrain's output directories carry: each marked by its writer's "format" tag, so a reader or a
rerun tells its own directory from anyone else's."""

from __future__ import annotations

import json
from pathlib import Path


def read_tagged(path: Path, tag: str, writer: str) -> dict | None:
    """The JSON object at `path` when `writer` wrote it (its "format" is `tag`); None when there is no such file; one
    line (ValueError) naming the file when it cannot be read or is someone else's."""
    if not path.exists():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path} ({error})") from None
    if not isinstance(value, dict) or value.get("format") != tag:
        raise ValueError(f"{path} is a file {writer} did not write")
    return value
