"""The shard index: ``DIR/index.json`` says which tar shards hold which split and how many samples each.

Layout::

    {"train": {"train-000000.tar": 500, "train-000001.tar": 437},
     "val":   {"val-000000.tar": 360},
     "meta":  {"format": 1, "source": "digits", "mode": "views", "channels": 1, "image_shape": [1, 8, 8],
               "labels": true, "num_classes": 10, ...}}

Every key except ``"meta"`` is a split name mapping shard file names (relative to ``DIR``) to sample counts.
The counts are the authority: the stream plans its reads from them, and the Rayleigh-Ritz job checks the
number of samples it saw against them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from eigtrain import safe_files

INDEX_NAME = "index.json"
META_KEY = "meta"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardIndex:
    root: Path
    splits: dict[str, dict[str, int]]
    meta: dict

    def shards(self, split: str) -> list[tuple[str, int]]:
        """(file name, sample count) of every shard of `split`, sorted by name."""
        if split not in self.splits:
            raise ValueError(f"split {split!r} is not in {self.root / INDEX_NAME}; available: {sorted(self.splits)}")
        shards = sorted(self.splits[split].items())
        if not shards or sum(n for _, n in shards) == 0:
            raise ValueError(f"split {split!r} in {self.root / INDEX_NAME} has no samples")
        return shards

    def num_samples(self, split: str) -> int:
        return sum(n for _, n in self.shards(split))

    def check_files(self, split: str) -> None:
        """Fail before any training starts if a shard of `split` is missing or empty on disk."""
        for name, _ in self.shards(split):
            path = self.root / name
            if not path.is_file():
                raise FileNotFoundError(f"shard {path} listed in {self.root / INDEX_NAME} does not exist")
            if path.stat().st_size == 0:
                raise ValueError(f"shard {path} listed in {self.root / INDEX_NAME} is empty (0 bytes)")


def read_index(root: str | os.PathLike) -> ShardIndex:
    """Read and validate ``root/index.json``."""
    root = Path(root)
    path = root / INDEX_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no shard index at {path}; write shards with `eigtrain-shards out={root} ...`")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exn:
        raise ValueError(f"cannot read shard index {path}: {exn}") from exn
    if not isinstance(raw, dict):
        raise ValueError(f"shard index {path} must be a JSON object, got {type(raw).__name__}")
    meta = raw.get(META_KEY, {})
    if meta.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise ValueError(f"shard index {path} has format {meta.get('format')}, this code reads {FORMAT_VERSION}")
    splits = {}
    for split, shards in raw.items():
        if split == META_KEY:
            continue
        if not isinstance(shards, dict) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shards.values()
        ):
            raise ValueError(f"shard index {path}: split {split!r} must map shard names to sample counts")
        splits[split] = dict(shards)
    return ShardIndex(root=root, splits=splits, meta=meta)


def write_index(root: Path, splits: dict[str, dict[str, int]], meta: dict) -> None:
    """Write ``index.json`` atomically: it appears only once every shard it lists is complete."""
    if META_KEY in splits:
        raise ValueError(f"{META_KEY!r} is reserved in {INDEX_NAME} and cannot be a split name")
    payload = {**splits, META_KEY: {"format": FORMAT_VERSION, **meta}}
    safe_files.write_text(root / INDEX_NAME, json.dumps(payload, indent=1, sort_keys=True) + "\n")
