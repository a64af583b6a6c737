"""An eigtrain-index output, opened for search: `open_index(out).search(queries, k)` -> (keys, scores).

The directory holds ``index.faiss`` (a FAISS index whose pre-transforms apply the similarity: l2 normalization,
or the eigenvalue scale sqrt(max(lambda, 0)), so queries go in as raw features, like the corpus did),
``keys.json`` (the sample key of row i) and ``manifest.json`` (kind, similarity, dims, the embed output it was
built from, both files' sha256), written last: a directory without it is not an index.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eigtrain.export.manifests import read_tagged
from eigtrain.runs.checksums import file_sha256

INDEX, KEYS, MANIFEST = "index.faiss", "keys.json", "manifest.json"
OWN = frozenset({INDEX, KEYS, MANIFEST})
FORMAT = "eigtrain-index-v1"  # manifest["format"]: the mark of a directory eigtrain-index wrote


def import_faiss() -> Any:
    """faiss, or one line saying what to install."""
    try:
        import faiss
    except ImportError:
        raise ValueError(
            "eigtrain-index needs faiss, which is not installed: pip install 'eigtrain[faiss]' (or faiss-cpu)"
        ) from None
    return faiss


def read_manifest(out: Path) -> dict | None:
    """The manifest of an eigtrain-index output in `out`, None when it has none; one line for anyone else's."""
    return read_tagged(out / MANIFEST, FORMAT, "eigtrain-index")


@dataclass
class EmbeddingIndex:
    index: Any  # the faiss index (pre-transforms included)
    keys: np.ndarray  # object array: row i's sample key
    manifest: dict

    @property
    def dims(self) -> int:
        return int(self.manifest["dims"])

    def search(self, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """The k best rows for each query: (keys (nq, k), scores (nq, k) float32), best first. `queries` are raw
        features of the same export (nq x D, D >= dims; the first dims are used), transformed inside the index as
        the corpus was. A slot with no result (k above what the index returns) has key None and score -inf."""
        q = np.asarray(queries, dtype=np.float32)
        q = q[None] if q.ndim == 1 else q
        if q.ndim != 2 or q.shape[1] < self.dims:
            raise ValueError(f"queries of shape {np.shape(queries)}: give nq x D features, D >= {self.dims}")
        if not np.isfinite(q).all():
            raise ValueError("a query holds NaN or inf")
        scores, rows = self.index.search(np.ascontiguousarray(q[:, : self.dims]), k)
        found = rows >= 0
        keys = self.keys[np.where(found, rows, 0)]
        keys[~found] = None
        return keys, np.where(found, scores, -np.inf).astype(np.float32)


def open_index(out: str | os.PathLike) -> EmbeddingIndex:
    """An eigtrain-index output, its files checked against the sha256 its manifest records; one line otherwise."""
    faiss = import_faiss()
    out = Path(out)
    manifest = read_manifest(out)
    if manifest is None:
        raise FileNotFoundError(f"{out} holds no eigtrain-index output (no {MANIFEST}): run eigtrain-index first")
    for name, record in manifest["files"].items():
        if not (out / name).is_file() or file_sha256(out / name) != record["sha256"]:
            raise ValueError(f"{out / name} is missing or changed since eigtrain-index wrote it: build the index again")
    keys = json.loads((out / KEYS).read_text())
    index = faiss.read_index(str(out / INDEX))
    if index.ntotal != len(keys) or index.d != manifest["dims"]:
        raise ValueError(f"{out}: the index holds {index.ntotal} x {index.d}, its keys {len(keys)}: build it again")
    return EmbeddingIndex(index, np.array(keys, dtype=object), manifest)
