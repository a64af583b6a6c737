"""eigtrain-index: a FAISS index of an eigtrain-embed output, filled block by block from its chunks.

    eigtrain-index embeddings=DIR out=DIR [kind=funnel|flat|ivfpq] [similarity=cosine|inner|spectral]
                   [dims=D] [k=16] [k_factor=20] [nlist=N] [pq_m=M] [nprobe=16] [train_rows=65536] [overwrite=true]

kind=funnel: a shortlist of k * k_factor by the first k coordinates, reranked at all dims (FAISS's
IndexPreTransform(RemapDimensionsTransform) under IndexRefineFlat); flat: exact search at dims; ivfpq: IVF-PQ at
dims, trained on train_rows rows sampled from the whole output. similarity=cosine scores each stage on the
l2-normalized cut vector; inner the plain inner product; spectral s = sum_j max(lambda_j, 0) x_j y_j with the
eigenvalues the embed output records. The transform lives inside the index file, so queries are raw features.
Writes out/index.faiss, out/keys.json (row i's sample key) and out/manifest.json; search with
eigtrain.export.index.open_index(out).search(queries, k). Needs faiss: pip install 'eigtrain[faiss]'.
"""

from __future__ import annotations

from dataclasses import dataclass

USAGE = __doc__  # eigtrain-index -h (eigtrain.commands): this module is its configuration, read before torch/faiss
KINDS = ("funnel", "flat", "ivfpq")
SIMILARITIES = ("cosine", "inner", "spectral")


@dataclass
class IndexConfig:
    embeddings: str | None = None  # a complete eigtrain-embed output directory
    out: str | None = None  # the index directory: new, empty, or an earlier eigtrain-index output with overwrite=true
    kind: str = "funnel"  # funnel | flat | ivfpq
    similarity: str = "cosine"  # cosine (after the cut) | inner | spectral (eigenvalue-weighted, lambda clipped at 0)
    dims: int | None = None  # index the first dims features (null: all the embed output has)
    k: int = 16  # funnel: the prefix the shortlist is searched at
    k_factor: int = 20  # funnel: shortlist size = k_factor x the number of results asked for
    nlist: int | None = None  # ivfpq: inverted lists (null: about 4 sqrt(n), at least 39 training rows each)
    pq_m: int | None = None  # ivfpq: sub-quantizers, a divisor of dims (null: the largest <= dims / 2)
    nprobe: int = 16  # ivfpq: lists visited per query (stored in the index)
    train_rows: int = 65536  # ivfpq: rows drawn at random (seed 0) to train the quantizers
    block_rows: int = 65536  # rows read and added at a time
    overwrite: bool = False  # replace an earlier eigtrain-index output at out=

    def validate(self) -> "IndexConfig":
        """The checks that need no data, no torch and no faiss: one line naming the key."""
        if not self.embeddings or not self.out:
            raise ValueError("give embeddings=DIR (an eigtrain-embed output) and out=DIR")
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not allowed; allowed: {', '.join(KINDS)}")
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"similarity={self.similarity!r} is not allowed; allowed: {', '.join(SIMILARITIES)}")
        for key in ("k", "k_factor", "nprobe", "train_rows", "block_rows"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("dims", "nlist", "pq_m"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)}: give a size >= 1 (or null: chosen from the data)")
        if self.dims is not None and self.kind == "funnel" and self.k > self.dims:
            raise ValueError(f"k={self.k} must not exceed dims={self.dims}: the funnel's prefix is part of the vector")
        return self
