"""Exact nearest-neighbour retrieval with cosine similarity, in torch or with FAISS (IndexFlatIP, `pip install
eigtrain[faiss]`, backend=faiss); both are exact searches on the same float32 normalized vectors and give the same
neighbours (up to exact ties). `auto` is torch: an exact search is one BLAS product and a top-k per block of
queries, and at eigtrain-eval's shape (10,000 queries against 60,000 vectors, 2 cores) FAISS's flat index measured
as fast at k = 16 and 3.7x slower at k = 784, side by side (`python tools/bench_retrieval.py --db 60000 --queries
10000 --dims 16 784 --search-only`); FAISS's own indexes (compressed, IVF) are where it is needed.

Metrics on a labelled split (queries = the validation split):
- 1-NN accuracy: the label of the nearest training vector is the query's;
- hit@k: among the query's k nearest *other* validation vectors there is one of its class (the
  deep-metric-learning protocol, often called Recall@k there: leave-one-out search within the split). Named hit@k
  here because recall@k is the other measure, the share of the exact full-size top-k a search returns
  (eigtrain.evaluate.funnels, eigtrain.evaluate.label_free).
"""

from __future__ import annotations

import time

import numpy as np
import torch

BACKENDS = ("auto", "torch", "faiss")


def resolve_backend(backend: str = "auto") -> str:
    """'faiss' when requested (and importable: else one line), else 'torch' (the module docstring says why)."""
    if backend not in BACKENDS:
        raise ValueError(f"retrieval backend={backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if backend in ("torch", "auto"):
        return "torch"
    try:
        import faiss  # noqa: F401
    except ImportError:
        raise ValueError("retrieval backend=faiss needs FAISS: pip install faiss-cpu (or eigtrain[faiss])") from None
    return "faiss"


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.detach().to(torch.float32), dim=1).contiguous()


def search(
    database: torch.Tensor,
    queries: torch.Tensor,
    k: int,
    backend: str = "torch",
    exclude_self: bool = False,
    block_elements: int = 1 << 26,
) -> torch.Tensor:
    """Indices (n_queries, k) of the k most cosine-similar database rows, most similar first. exclude_self:
    queries are the database itself and row i never returns i. torch scores queries in blocks of at most
    `block_elements` similarities (256 MB)."""
    db, q = unit_rows(database), unit_rows(queries)
    k = min(k, len(db) - exclude_self)
    if resolve_backend(backend) == "faiss":
        return _search_faiss(db, q, k, exclude_self)
    out, block = [], max(1, min(len(q), block_elements // max(len(db), 1)))
    scores = torch.empty(block, len(db))  # one buffer for every block: fresh memory is costly to touch
    for s in range(0, len(q), block):
        part = q[s : s + block]
        sims = torch.matmul(part, db.T, out=scores[: len(part)])
        if exclude_self:
            rows = torch.arange(len(sims))
            sims[rows, rows + s] = -float("inf")
        out.append(sims.max(1).indices[:, None] if k == 1 else sims.topk(k, dim=1).indices)  # max: no sort
    return torch.cat(out)


def _search_faiss(db: torch.Tensor, q: torch.Tensor, k: int, exclude_self: bool) -> torch.Tensor:
    import faiss

    index = faiss.IndexFlatIP(db.shape[1])
    index.add(db.numpy())
    _, found = index.search(q.numpy(), k + exclude_self)
    if exclude_self:  # drop the query itself; where an exact duplicate outranked it, drop the last hit instead
        keep = found != np.arange(len(found))[:, None]
        keep[keep.all(1), -1] = False
        found = found[keep].reshape(len(found), k)
    return torch.from_numpy(found.astype(np.int64))


def retrieval_metrics(train_x, train_y, test_x, test_y, ks=(1, 10), backend: str = "torch") -> dict[str, float]:
    """{"1nn": ..., "hit@1": ..., "hit@10": ...} as fractions (see the module docstring)."""
    train_y, test_y = train_y.long(), test_y.long()
    nearest = search(train_x, test_x, 1, backend)[:, 0]
    n = len(test_y)  # fractions from exact counts
    metrics = {"1nn": (train_y[nearest] == test_y).sum().item() / n}
    neighbours = search(test_x, test_x, max(ks), backend, exclude_self=True)
    hits = test_y[neighbours] == test_y[:, None]
    for k in ks:
        metrics[f"hit@{k}"] = hits[:, :k].any(1).sum().item() / n
    return metrics


def search_seconds_per_query(
    database: torch.Tensor,
    queries: torch.Tensor,
    k: int = 10,
    backend: str = "torch",
    repeats: int = 3,
    max_queries: int = 1024,
) -> float:
    """Wall time of one exact top-k search of (at most `max_queries`) queries, float32, per query; the best
    of `repeats`."""
    best, queries = float("inf"), queries[:max_queries]
    search(database[:8], queries[:8], 1, backend)  # warm up (lazy imports, allocator)
    for _ in range(repeats):
        start = time.perf_counter()
        search(database, queries, k, backend)
        best = min(best, time.perf_counter() - start)
    return best / len(queries)


def bytes_per_vector(k: int) -> dict[str, int]:
    """Storage of one k-dimensional vector: float32, float16, int8 (scalar quantization; the per-dimension
    scales are stored once per index, not per vector)."""
    return {"fp32": 4 * k, "fp16": 2 * k, "int8": k}


def storage(database: torch.Tensor, queries: torch.Tensor, dims, backend: str) -> dict[int, dict]:
    """Per k: bytes per vector and the measured exact top-10 search time per query on the first k features."""
    seconds = {k: search_seconds_per_query(database[:, :k], queries[:, :k], 10, backend) for k in dims}
    return {k: {**bytes_per_vector(k), "search_us_per_query": 1e6 * seconds[k]} for k in dims}


def retrieval_report(train, test, train_y, test_y, dims, prefixes, fixed, subsets, draws, backend) -> dict:
    """Retrieval per method and k; storage and measured search time per k (on the first ordered features)."""
    metrics = lambda tr, te: retrieval_metrics(tr, train_y, te, test_y, backend=backend)  # noqa: E731
    rows: dict[str, dict[int, dict[str, float]]] = {}
    for label, name in prefixes.items():
        rows[label] = {k: metrics(train[name][:, :k], test[name][:, :k]) for k in dims}
    if fixed:
        rows["FF"] = {k: metrics(*fixed[k]) for k in dims if k in fixed}
    if subsets and draws > 0:
        rows["RS"] = {}
        for k in dims:
            runs = [metrics(train["raw"][:, s], test["raw"][:, s]) for s in subsets[k][:draws]]
            rows["RS"][k] = {m: sum(r[m] for r in runs) / len(runs) for m in runs[0]}
    timed = next(iter(prefixes.values()), "raw")  # search time depends on k and the sizes, not on the method
    return {
        "retrieval": rows,
        "storage": storage(train[timed], test[timed], dims, backend),
        "retrieval_setup": {"backend": backend, "database": len(train_y), "queries": len(test_y), "rs_draws": draws},
    }
