"""Side-by-side costs of issue 14's paths, as JSON ratios measured in one run:

- Rayleigh-Ritz over embedding pairs streamed from memory-mapped .npy chunks vs the same rows in memory;
- exact cosine top-10 search per query, FAISS (when installed) vs torch, at several prefix sizes k.

    python tools/bench_retrieval.py [--rows 200000] [--dim 256] [--db 50000] [--queries 2000] [--dims 16 64 256]
    python tools/bench_retrieval.py --db 60000 --queries 10000 --dims 16 784 --search-only   # eigtrain-eval's shape
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eigtrain.evaluate.retrieval import resolve_backend, search_seconds_per_query
from eigtrain.export.command import reduce_embeddings
from eigtrain.export.moments import RRAccumulator


def _best(fn, repeats=3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_streaming(rows: int, dim: int) -> dict:
    rng = np.random.default_rng(0)
    z1 = rng.standard_normal((rows, dim), dtype=np.float32)
    z2 = (z1 + 0.5 * rng.standard_normal((rows, dim), dtype=np.float32)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for i, s in enumerate(range(0, rows, rows // 8)):
            np.save(Path(tmp) / f"part-{i:03d}.z1.npy", z1[s : s + rows // 8])
            np.save(Path(tmp) / f"part-{i:03d}.z2.npy", z2[s : s + rows // 8])

        def in_memory():
            acc = RRAccumulator(dim)
            for s in range(0, rows, 65536):
                acc.update(torch.from_numpy(z1[s : s + 65536]), torch.from_numpy(z2[s : s + 65536]))

        t_memory = _best(in_memory)
        t_stream = _best(lambda: reduce_embeddings(tmp, pairs=False))
    return {
        "rows": rows,
        "dim": dim,
        "in_memory_s": round(t_memory, 3),
        "streamed_chunks_s": round(t_stream, 3),
        "streamed_over_in_memory": round(t_stream / t_memory, 3),
    }


def _has_faiss() -> bool:
    try:
        resolve_backend("faiss")
    except ValueError:
        return False
    return True


def bench_search(db: int, queries: int, dims: list[int]) -> dict:
    gen = torch.Generator().manual_seed(0)
    base, q = torch.randn(db, max(dims), generator=gen), torch.randn(queries, max(dims), generator=gen)
    out = {"database": db, "queries": queries, "faiss": _has_faiss(), "per_k": {}}
    for k in dims:
        row = {
            "torch_us_per_query": 1e6
            * search_seconds_per_query(base[:, :k], q[:, :k], 10, "torch", max_queries=queries)
        }
        if out["faiss"]:
            row["faiss_us_per_query"] = 1e6 * search_seconds_per_query(
                base[:, :k], q[:, :k], 10, "faiss", max_queries=queries
            )
            row["torch_over_faiss"] = row["torch_us_per_query"] / row["faiss_us_per_query"]
        out["per_k"][k] = {key: round(v, 3) for key, v in row.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--db", type=int, default=50_000)
    parser.add_argument("--queries", type=int, default=2_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--search-only", action="store_true", help="skip the streaming comparison")
    args = parser.parse_args()
    result = {} if args.search_only else {"rr_streaming": bench_streaming(args.rows, args.dim)}
    result["search"] = bench_search(args.db, args.queries, args.dims)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
