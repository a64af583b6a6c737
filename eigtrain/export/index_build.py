"""eigtrain-index's work: a FAISS index of an eigtrain-embed output, filled block by block from its chunks (usage
and configuration: eigtrain.export.index_config, checked before this module is imported).

The similarity is a chain of FAISS pre-transforms, so the file alone searches raw features: cosine =
NormalizationTransform (then, in the funnel's first stage, RemapDimensionsTransform to the first k and a second
normalization: cosine after the cut at both stages); spectral = a diagonal LinearTransform sqrt(max(lambda, 0)),
a negative eigenvalue giving its coordinate no weight rather than NaN; inner = none. Every kind scores by inner
product. The compressed kind is trained on a bounded random sample; nothing holds more rows than that sample or
one block besides the index itself.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from eigtrain import safe_files
from eigtrain.export.embed_chunks import MANIFEST as EMBED_MANIFEST
from eigtrain.export.embed_read import checked_dims, complete_manifest, iter_embeddings
from eigtrain.export.index import FORMAT, INDEX, KEYS, MANIFEST, OWN, import_faiss, read_manifest
from eigtrain.export.index_config import USAGE, IndexConfig
from eigtrain.runs.checksums import file_sha256
from eigtrain.runs.output_dirs import OutputDirError, check_output_dir

PQ_ROWS_PER_CENTROID = 8  # training rows per PQ centroid at least: a small output gets fewer bits per code


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an out= holding anything but an eigtrain-index output, or one without overwrite=."""
    check_output_dir(out, OWN, "out")
    if read_manifest(out) is not None and not overwrite:
        raise OutputDirError(f"out={out} holds an eigtrain-index output: give overwrite=true to replace it")


def spectral_scale(manifest: dict, dims: int, source: Path) -> np.ndarray:
    """sqrt(max(lambda_j, 0)) for j < dims from the embed output's eigenvalues; one line when it records none."""
    eigenvalues = np.asarray(manifest.get("eigenvalues") or [], dtype=np.float64)
    if len(eigenvalues) < dims or not np.isfinite(eigenvalues[:dims]).all():
        raise ValueError(
            f"similarity=spectral weighs by the eigenvalues, and {source / EMBED_MANIFEST} records "
            f"{len(eigenvalues)} finite ones for {dims} features: use similarity=cosine or inner"
        )
    return np.sqrt(np.clip(eigenvalues[:dims], 0.0, None))


def ivfpq_shape(cfg: IndexConfig, dims: int, n: int) -> dict:
    """nlist, pq_m, nbits and the training rows of an IVF-PQ index of n rows at dims; one line when they cannot fit."""
    rows = min(cfg.train_rows, n)
    nlist = cfg.nlist or max(1, min(round(4 * math.sqrt(n)), rows // 39))
    pq_m = cfg.pq_m or max(m for m in range(1, max(dims // 2, 1) + 1) if dims % m == 0)
    if dims % pq_m:
        raise ValueError(f"pq_m={pq_m} must divide dims={dims}")
    if nlist > rows:
        raise ValueError(f"nlist={nlist} is more lists than the {rows} training rows: lower nlist or raise train_rows")
    nbits = min(8, max(1, int(math.log2(max(rows // PQ_ROWS_PER_CENTROID, 2)))))
    return {"nlist": nlist, "pq_m": pq_m, "nbits": nbits, "nprobe": cfg.nprobe, "rows": rows}


def _outer_transform(faiss, similarity: str, dims: int, scale: np.ndarray | None):
    if similarity == "cosine":
        return faiss.NormalizationTransform(dims, 2.0)
    if similarity == "spectral":
        assert scale is not None
        linear = faiss.LinearTransform(dims, dims, False)
        faiss.copy_array_to_vector(np.diag(scale).astype(np.float32).ravel(), linear.A)
        linear.is_trained = True
        return linear
    return None


def make_index(faiss, cfg: IndexConfig, dims: int, scale: np.ndarray | None, shape: dict | None) -> Any:
    """The empty index: the similarity's transform over the kind's inner-product index."""
    if cfg.kind == "funnel":
        first = faiss.IndexPreTransform(faiss.IndexFlatIP(cfg.k))  # the shortlist: the first k coordinates
        if cfg.similarity == "cosine":  # the cut vector renormalized: cosine after the cut
            first.prepend_transform(faiss.NormalizationTransform(cfg.k, 2.0))
        first.prepend_transform(faiss.RemapDimensionsTransform(dims, cfg.k, False))
        core = faiss.IndexRefineFlat(first)
        core.k_factor = float(cfg.k_factor)
    elif cfg.kind == "flat":
        core = faiss.IndexFlatIP(dims)
    else:
        assert shape is not None
        quantizer = faiss.IndexFlatIP(dims)
        core = faiss.IndexIVFPQ(
            quantizer, dims, shape["nlist"], shape["pq_m"], shape["nbits"], faiss.METRIC_INNER_PRODUCT
        )
        core.nprobe = shape["nprobe"]
        core.pq.cp.min_points_per_centroid = PQ_ROWS_PER_CENTROID  # faiss's warning below that, not its default 39
    outer = _outer_transform(faiss, cfg.similarity, dims, scale)
    return core if outer is None else faiss.IndexPreTransform(outer, core)


def training_sample(source: Path, dims: int, n: int, rows: int, block_rows: int) -> np.ndarray:
    """`rows` of the n rows, drawn at random without replacement (seed 0) from the whole output, in one pass."""
    wanted = np.sort(np.random.default_rng(0).choice(n, size=rows, replace=False))
    parts, offset = [], 0
    for _, block in iter_embeddings(source, dims, block_rows):
        lo, hi = np.searchsorted(wanted, [offset, offset + len(block)])
        parts.append(block[wanted[lo:hi] - offset])
        offset += len(block)
    return np.ascontiguousarray(np.concatenate(parts))


def build(cfg: IndexConfig) -> dict:
    """Build the index, then write it: keys and index first, the manifest last (the mark of a complete output)."""
    cfg.validate()
    faiss = import_faiss()
    source, out = Path(cfg.embeddings or ""), Path(cfg.out or "")
    check_out(out, cfg.overwrite)
    embedded = complete_manifest(source)
    source_sha256 = file_sha256(source / EMBED_MANIFEST)
    dims = checked_dims(embedded, cfg.dims, "dims")
    if cfg.kind == "funnel" and cfg.k > dims:
        raise ValueError(f"k={cfg.k} must not exceed dims={dims}: the funnel's prefix is part of the vector")
    n, start = int(embedded["count"]), time.perf_counter()
    scale = spectral_scale(embedded, dims, source) if cfg.similarity == "spectral" else None
    shape = ivfpq_shape(cfg, dims, n) if cfg.kind == "ivfpq" else None
    index = make_index(faiss, cfg, dims, scale, shape)
    if shape is not None:
        index.train(training_sample(source, dims, n, shape.pop("rows"), cfg.block_rows))
    keys: list[str] = []
    for block_keys, block in iter_embeddings(source, dims, cfg.block_rows):
        index.add(block)
        keys += block_keys
    record = {
        "format": FORMAT,
        "kind": cfg.kind,
        "similarity": cfg.similarity,
        "metric": "inner_product",  # after the pre-transforms, every kind
        "dims": dims,
        "n": len(keys),
        **({"k": cfg.k, "k_factor": cfg.k_factor} if cfg.kind == "funnel" else {}),
        **(shape or {}),
        **({"scale": [float(s) for s in scale]} if scale is not None else {}),
        "embeddings": {"path": str(source.resolve()), "manifest_sha256": source_sha256},
        "keys": KEYS,
        "faiss": getattr(faiss, "__version__", None),
    }
    write(out, faiss, index, keys, record)
    seconds = time.perf_counter() - start
    print(f"eigtrain-index: {cfg.kind} index of {len(keys)} x {dims} ({cfg.similarity}) in {out}, {seconds:.1f} s")
    return record


def write(out: Path, faiss, index, keys: list[str], record: dict) -> None:
    """The output, each file atomically; an earlier output's manifest goes first, so no mix is ever an index."""
    safe_files.make_dir(out)
    if (out / MANIFEST).exists():
        (out / MANIFEST).unlink()
    safe_files.write_text(out / KEYS, json.dumps(keys) + "\n")
    safe_files.write_with(out / INDEX, lambda tmp: faiss.write_index(index, str(tmp)))
    record["files"] = {name: {"sha256": file_sha256(out / name)} for name in (INDEX, KEYS)}
    safe_files.write_text(out / MANIFEST, json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    from eigtrain.cli import asks_for_help, compose_dataclass, one_line_errors

    args = sys.argv[1:] if argv is None else list(argv)
    if asks_for_help(args, USAGE):
        return 0
    return one_line_errors("eigtrain-index", lambda: build(compose_dataclass(IndexConfig, args)))


if __name__ == "__main__":
    sys.exit(main())
