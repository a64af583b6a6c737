"""eigtrain-embed outputs written straight from an array (no run, no encoder): the chunks and the complete
manifest exactly as eigtrain-embed writes them, for the readers and the index (tests, tools/bench_index.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from eigtrain.export.embed_chunks import FORMAT, chunk_files, chunk_records, write_chunk, write_manifest


def write_embed_output(
    out: Path, features: np.ndarray, eigenvalues=None, chunk_size: int = 4096, dtype: str = "float32", ranks: int = 1
) -> Path:
    """`features` (n x k) as a complete embed output in `out`, rows split contiguously over `ranks`, keys
    `s{row:08d}`, `eigenvalues` (None: none recorded) in the manifest."""
    n, k = features.shape
    spec = {"k": k, "dtype": dtype, "split": "synthetic", "data": "synthetic", "input": "raw"}
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        lo, hi = n * rank // ranks, n * (rank + 1) // ranks
        for index, start in enumerate(range(lo, hi, chunk_size)):
            stop = min(start + chunk_size, hi)
            rows = torch.from_numpy(np.ascontiguousarray(features[start:stop])).to(getattr(torch, dtype))
            write_chunk(out, rank, index, [f"s{i:08d}" for i in range(start, stop)], rows, spec)
    files = chunk_files(out)
    manifest = {
        "format": FORMAT,
        "settings": spec,
        "dim": k,
        "complete": True,
        "count": n,
        "chunks": len(files),
        "chunk_files": chunk_records(files),
    }
    if eigenvalues is not None:
        manifest["eigenvalues"] = [float(v) for v in eigenvalues]
    write_manifest(out, manifest)
    return out
