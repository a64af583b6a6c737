"""Reading an eigtrain-embed output: its complete manifest, checked against the chunks it lists, and the features
streamed block by block as numpy (`iter_embeddings`), so an index can be filled from outputs larger than memory.

Every chunk is checked before a row is read: the manifest lists it with the sha256 it was written with, and its own
metadata names this output's settings, width and dtype (eigtrain.export.embed_chunks). A chunk is memory-mapped and
read `block_rows` rows at a time, never whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors import safe_open

from eigtrain.export.embed_chunks import FORMAT, MANIFEST, changed_chunks, chunk_files, chunk_keys
from eigtrain.export.manifests import read_tagged

BLOCK_ROWS = 65536


def complete_manifest(out: str | os.PathLike) -> dict:
    """The manifest of a complete eigtrain-embed output whose chunks are as it recorded them; one line otherwise."""
    out = Path(out)
    manifest = read_tagged(out / MANIFEST, FORMAT, "eigtrain-embed")
    if manifest is None:
        raise FileNotFoundError(f"{out} holds no eigtrain-embed output (no {MANIFEST}): run eigtrain-embed first")
    if not manifest.get("complete"):
        raise ValueError(f"{out} holds no complete eigtrain-embed output (run eigtrain-embed to finish it)")
    changed = changed_chunks(out, manifest) if "chunk_files" in manifest else []
    if changed:
        raise ValueError(
            f"{out}: chunk(s) {', '.join(changed[:3])} removed or changed since the output was complete: run "
            f"eigtrain-embed again with the same settings (it embeds what is missing)"
        )
    return manifest


def checked_dims(manifest: dict, dims: int | None, key: str = "k") -> int:
    """`dims` (None: every stored feature), checked against the output's width."""
    width = int(manifest["settings"]["k"])
    if dims is not None and not 1 <= dims <= width:
        raise ValueError(f"{key}={dims} must lie in 1..{width}: the embed output has {width} features")
    return width if dims is None else dims


def iter_embeddings(
    out: str | os.PathLike,
    dims: int | None = None,
    block_rows: int = BLOCK_ROWS,
    dtype: type | None = np.float32,
) -> Iterator[tuple[list[str], np.ndarray]]:
    """(keys, features[:, :dims]) of a complete eigtrain-embed output, at most `block_rows` rows at a time, in the
    chunks' order (rank, then index; `read_embeddings` sorts by key). The blocks are numpy arrays of `dtype`
    (float32 by default, float16 chunks converted block by block; None: as stored). Chunks are checked first."""
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    manifest = complete_manifest(out)
    dims = checked_dims(manifest, dims)
    for path in chunk_files(Path(out)):
        keys = chunk_keys(path, manifest["settings"])  # this output's settings, rows, width and dtype
        with safe_open(str(path), "np") as chunk:
            rows = chunk.get_slice("features")
            for start in range(0, len(keys), block_rows):
                stop = min(start + block_rows, len(keys))
                block = rows[start:stop, :dims]
                yield keys[start:stop], block if dtype is None else np.ascontiguousarray(block, dtype=dtype)
