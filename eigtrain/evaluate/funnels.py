"""Adaptive retrieval over ordered features, planned by the spectrum (issue 36.3): prefix searches, funnels
(shortlist at k1, rerank at k2, ...), and an exact search that stops early where a tail bound proves the top-10.

The score is s(q, x) = sum_i w_i psi_i(q) psi_i(x): w the eigenvalues (the eigenvalue-weighted score) or all ones
(the plain inner product). Its prefix at k sums i <= k; its tail beyond k obeys Cauchy-Schwarz:
|sum_{i>k} w_i q_i x_i| <= max_{i>k} |w_i| * ||q_{>k}|| * ||x_{>k}||, true for any order and sign of w (the max of
|w| over the tail, not w_{k+1}). One tail norm per vector per cut is stored, rounded up to the stored dtype.

Costs are per query and counted, not timed: multiply-adds (a prefix score at k is k of them; a stage reranking
m vectors at k costs m*k, recomputed from scratch as MRL's funnel does; a bound check is one multiply) and bytes
of the index read (the stored coordinates, tail norms, PQ codes and tables). Selecting a top-m is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOP = 10
# The spectrum's funnel rule, fixed before any recall was measured (never tuned on reported numbers): a stage's k
# is the smallest prefix whose tail holds at most this share of the score's variance, sum_{i>k} w_i^2 E[psi_i^2]^2
# over the whole sum (independent query and vector: the variance of term i is w_i^2 E[psi_i^2]^2).
SPECTRUM_TAIL_SHARES = (0.1, 0.01)
SHORTLIST = 200  # MRL's adaptive retrieval: a shortlist of 200 at a low dimension, reranked at full size
SECOND_SHORTLIST = 50


@dataclass
class Cost:
    """Per-query multiply-adds and bytes read, summed over the queries searched."""

    macs: float = 0.0
    bytes: float = 0.0
    queries: int = 0

    def add(self, macs: float, nbytes: float, queries: int = 1) -> None:
        self.macs += macs
        self.bytes += nbytes
        self.queries += queries

    def per_query(self) -> dict:
        q = max(self.queries, 1)
        return {"macs_per_query": self.macs / q, "bytes_per_query": self.bytes / q}


@dataclass
class PrefixIndex:
    """A corpus of ordered features (n, d), stored as given, with the score's weights and the tail norms at `cuts`."""

    vectors: np.ndarray
    weights: np.ndarray
    cuts: tuple[int, ...] = ()
    tail_norms: np.ndarray = field(init=False)  # (n, len(cuts)): ||x_{>k}|| rounded up to the stored dtype
    tail_scale: np.ndarray = field(init=False)  # (len(cuts),): max_{i>k} |w_i|, 0 at k = d
    max_abs: float = field(init=False)  # the largest |coordinate|: the rounding slack's scale

    def __post_init__(self) -> None:
        n, d = self.vectors.shape
        if self.weights.shape != (d,):
            raise ValueError(f"weights have shape {self.weights.shape}; the vectors have {d} coordinates")
        self.weights = np.asarray(self.weights, dtype=np.float64)
        self.cuts = tuple(sorted({int(k) for k in self.cuts if 0 < k < d} | {d}))
        self.tail_norms = upward_tail_norms(self.vectors, self.cuts)
        absw = np.abs(self.weights)
        self.tail_scale = np.array([absw[k:].max() if k < d else 0.0 for k in self.cuts])
        self.max_abs = float(np.abs(self.vectors).max()) if n else 0.0

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def itemsize(self) -> int:
        return int(self.vectors.dtype.itemsize)


def upward_tail_norms(vectors: np.ndarray, cuts: tuple[int, ...]) -> np.ndarray:
    """||x_{>k}|| for each k in cuts, computed in float64 and stored in the vectors' dtype rounded up (never below
    the exact norm, so the bound stays an upper bound)."""
    x = vectors.astype(np.float64)
    suffix = np.cumsum((x * x)[:, ::-1], axis=1)[:, ::-1]  # suffix[:, j] = sum_{i>=j} x_i^2
    suffix = np.concatenate([suffix, np.zeros((len(x), 1))], axis=1)
    exact = np.sqrt(suffix[:, list(cuts)])
    stored = exact.astype(vectors.dtype)
    low = stored.astype(np.float64) < exact
    stored[low] = np.nextafter(stored[low], np.inf)
    return stored


def exact_top(index: PrefixIndex, queries: np.ndarray, k: int | None = None, top: int = TOP) -> np.ndarray:
    """(n_queries, top) indices of the largest prefix scores at k (default: full d), best first, in float64."""
    k = index.dim if k is None else k
    x = index.vectors[:, :k].astype(np.float64)
    qw = queries[:, :k].astype(np.float64) * index.weights[:k]
    out = []
    for s in range(0, len(qw), 64):
        out.append(_top_rows(qw[s : s + 64] @ x.T, top))
    return np.concatenate(out)


def _top_rows(scores: np.ndarray, top: int) -> np.ndarray:
    """Column indices of each row's `top` largest scores, largest first (ties by index)."""
    top = min(top, scores.shape[1])
    part = np.argpartition(-scores, top - 1, axis=1)[:, :top]
    order = np.lexsort((part, -np.take_along_axis(scores, part, axis=1)), axis=1)
    return np.take_along_axis(part, order, axis=1)


def recall_at(found: np.ndarray, reference: np.ndarray, top: int = TOP) -> float:
    """Mean share of each query's reference top-`top` found among its `top` results."""
    hits = [len(set(f[:top].tolist()) & set(r[:top].tolist())) for f, r in zip(found, reference)]
    return float(np.mean(hits)) / top


def funnel_search(
    index: PrefixIndex, queries: np.ndarray, stages: list[tuple[int, int]], cost: Cost, top: int = TOP
) -> np.ndarray:
    """MRL's funnel: stage (k, m) keeps the m best of the previous stage's survivors by the prefix score at k (the
    first stage scores the whole corpus); the last stage keeps `top`. Each stage costs survivors * k."""
    n = len(index.vectors)
    out = []
    for s in range(0, len(queries), 32):
        qw = queries[s : s + 32].astype(np.float64) * index.weights
        k, m = stages[0]
        survivors = _top_rows(qw[:, :k] @ index.vectors[:, :k].T.astype(np.float64), m)  # the whole corpus
        for k, m in stages[1:]:
            x = index.vectors[survivors, :k].astype(np.float64)  # (b, survivors, k)
            scores = np.einsum("bk,bmk->bm", qw[:, :k], x)
            survivors = np.take_along_axis(survivors, _top_rows(scores, m), axis=1)
        out.append(survivors[:, :top])
    per_query = funnel_cost(n, stages, index.itemsize)
    cost.add(per_query[0] * len(queries), per_query[1] * len(queries), len(queries))
    return np.concatenate(out)


def funnel_cost(n: int, stages: list[tuple[int, int]], itemsize: int) -> tuple[float, float]:
    """Multiply-adds and bytes of one query through the funnel (the query's weighting: k multiplies per stage)."""
    macs = nbytes = 0.0
    survivors = n
    for k, m in stages:
        macs += survivors * k + k
        nbytes += survivors * k * itemsize
        survivors = min(m, survivors)
    return macs, nbytes


def bound_search(index: PrefixIndex, query: np.ndarray, cost: Cost, top: int = TOP) -> tuple[np.ndarray, int]:
    """The exact top-`top` under the full score (best first) and the cut where the tail bound proved it.

    At each cut the candidates' prefix scores grow by the new coordinates; each has the interval prefix +- bound.
    A candidate whose upper end is below the top-th largest lower end cannot be in the top (top candidates are
    at least that good), so it is dropped; the search stops once the top lower ends all reach the others' upper
    ends, and finishes those `top` exactly (top * (d - k)) to order them."""
    x, d, n = index.vectors, index.dim, len(index.vectors)
    qw = query.astype(np.float64) * index.weights
    q_tail = upward_tail_norms(query[None, :], index.cuts)[0].astype(np.float64)
    slack = _rounding_slack(index, qw)
    cand, partial, prev = np.arange(n), np.zeros(n), 0
    macs, nbytes = 2.0 * d, 0.0  # the query's weighting and its tail norms
    for c, k in enumerate(index.cuts):
        partial = partial + x[cand, prev:k].astype(np.float64) @ qw[prev:k]
        macs += len(cand) * (k - prev) + len(cand)
        nbytes += len(cand) * ((k - prev) + 1) * index.itemsize
        radius = index.tail_scale[c] * q_tail[c] * index.tail_norms[cand, c].astype(np.float64)
        prev, lo, hi = k, partial - radius - slack, partial + radius + slack
        if len(cand) > top:
            tau = np.partition(lo, len(lo) - top)[len(lo) - top]
            keep = hi >= tau
            cand, partial, lo, hi = cand[keep], partial[keep], lo[keep], hi[keep]
        best = _top_rows(lo[None, :], top)[0]
        rest = np.ones(len(cand), dtype=bool)
        rest[best] = False
        if k == d or not rest.any() or lo[best].min() > hi[rest].max():  # at d the scores are exact (ties too)
            winners = cand[best]
            final = partial[best] + x[winners, k:].astype(np.float64) @ qw[k:]
            macs += len(winners) * (d - k)
            nbytes += len(winners) * (d - k) * index.itemsize
            cost.add(macs, nbytes)
            return winners[_top_rows(final[None, :], top)[0]], k
    raise AssertionError("unreachable: the last cut is d, where the top is decided")


def _rounding_slack(index: PrefixIndex, qw: np.ndarray) -> float:
    """A bound on the float64 rounding of any partial score (at most d terms, their magnitudes summing to at most
    max|x| * sum|qw|), added to both ends of every interval so rounding never prunes a true winner."""
    return 4.0 * index.dim * float(np.finfo(np.float64).eps) * index.max_abs * float(np.abs(qw).sum())


def spectrum_cuts(weights: np.ndarray, second_moments: np.ndarray, shares=SPECTRUM_TAIL_SHARES) -> list[int]:
    """For each share, the smallest k whose tail holds at most that share of the score's variance,
    sum_{i>k} w_i^2 E[psi_i^2]^2 / sum_i w_i^2 E[psi_i^2]^2 (the rule of SPECTRUM_TAIL_SHARES)."""
    contrib = np.asarray(weights, dtype=np.float64) ** 2 * np.asarray(second_moments, dtype=np.float64) ** 2
    tail = np.concatenate([np.cumsum(contrib[::-1])[::-1], [0.0]]) / contrib.sum()  # tail[k] = share beyond k
    return [int(np.flatnonzero(tail <= share)[0]) for share in shares]


def spectrum_funnels(weights: np.ndarray, second_moments: np.ndarray) -> dict[str, list[tuple[int, int]]]:
    """The funnels the spectrum chooses: MRL's shortlist at k1 then full d, and a three-stage k1 -> k2 -> d; each
    without redundant stages (`plain_stages`), and a plan that comes out the same as another given once."""
    d = len(weights)
    k1, k2 = (max(1, k) for k in spectrum_cuts(weights, second_moments))
    plans = [[(k1, SHORTLIST), (d, TOP)], [(k1, SHORTLIST), (k2, SECOND_SHORTLIST), (d, TOP)]]
    funnels: dict[str, list[tuple[int, int]]] = {}
    for stages in map(plain_stages, plans):
        name = "spectrum " + " -> ".join(f"{m}@{k}" if m != TOP else f"{k}" for k, m in stages)
        if stages not in funnels.values():
            funnels[name] = stages
    return funnels


def plain_stages(stages: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A funnel without redundant stages: a stage that scores at no more coordinates than the stage before it
    reranks by the same (or a coarser) prefix, so its cut is merged into the stage before (keeping the smaller
    shortlist); e.g. 200@16 -> 50@16 -> 64 is 50@16 -> 64, and 200@64 -> 64 at d = 64 is 10@64 (a full search)."""
    plain: list[tuple[int, int]] = []
    for k, m in stages:
        if plain and k <= plain[-1][0]:
            plain[-1] = (plain[-1][0], min(plain[-1][1], m))
        else:
            plain.append((k, m))
    return plain


def pca_axes(vectors: np.ndarray) -> np.ndarray:
    """(d, d) principal axes of the vectors' centred covariance, largest variance first. Apply as x @ axes to the
    corpus and the queries alike (a rotation, not centred: inner products at full d are unchanged, so the full-size
    reference is the same)."""
    x = vectors.astype(np.float64)
    centred = x - x.mean(axis=0)
    variances, axes = np.linalg.eigh(centred.T @ centred / len(x))
    return axes[:, np.argsort(-variances, kind="stable")]


@dataclass
class IVFPQShortlist:
    """faiss.IndexIVFPQ (inner product) over the first k coordinates, scaled by sqrt|w| (the query by sign(w) sqrt|w|,
    so inner products are the weighted prefix score for any sign of w): the compressed first stage of a funnel."""

    k: int
    nlist: int
    subquantizers: int
    nprobe: int
    faiss_index: object
    list_sizes: np.ndarray


def build_ivfpq(index: PrefixIndex, k: int, nlist: int, nprobe: int, seed: int = 0) -> IVFPQShortlist:
    """Train IVF-PQ on the corpus' first k coordinates: nlist lists, k/2 sub-quantizers of 8 bits (2 coordinates
    per byte when k is even), nprobe lists searched."""
    import faiss

    sub = max(m for m in range(1, max(k // 2, 1) + 1) if k % m == 0)
    x = np.ascontiguousarray(index.vectors[:, :k] * np.sqrt(np.abs(index.weights[:k])), dtype=np.float32)
    quantizer = faiss.IndexFlatIP(k)
    ivf = faiss.IndexIVFPQ(quantizer, k, nlist, sub, 8, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = seed
    ivf.pq.cp.seed = seed
    ivf.train(x)
    ivf.add(x)
    ivf.nprobe = nprobe
    lists = ivf.invlists
    assert lists is not None  # an IVF index always has its lists once built
    sizes = np.array([lists.list_size(i) for i in range(nlist)])
    return IVFPQShortlist(k, nlist, sub, nprobe, ivf, sizes)


def ivfpq_funnel_search(
    index: PrefixIndex,
    pq: IVFPQShortlist,
    queries: np.ndarray,
    rerank: list[tuple[int, int]],
    cost: Cost,
    shortlist_size: int = SHORTLIST,
) -> np.ndarray:
    """Shortlist `shortlist_size` by IVF-PQ at pq.k, then the flat stages `rerank` on the stored vectors. The first stage
    costs what PQ does: the coarse search (nlist * k), the look-up tables (256 * k), one look-up-add per
    sub-quantizer per scanned code; bytes: centroids, codebooks, and the scanned codes with their 8-byte ids."""
    k = pq.k
    w = index.weights[:k]
    q = np.ascontiguousarray(queries[:, :k] * np.sign(w) * np.sqrt(np.abs(w)), dtype=np.float32)
    ivf = pq.faiss_index
    _, shortlist = ivf.search(q, shortlist_size)  # type: ignore[attr-defined]
    _, probed = ivf.quantizer.search(q, pq.nprobe)  # type: ignore[attr-defined]
    scanned = pq.list_sizes[probed].sum(axis=1).astype(np.float64)
    macs = (pq.nlist * k + 256 * k + k) * len(q) + scanned.sum() * pq.subquantizers
    nbytes = (pq.nlist * k + 256 * k) * 4 * len(q) + scanned.sum() * (pq.subquantizers + 8)
    out = []
    for i in range(len(q)):
        survivors = shortlist[i][shortlist[i] >= 0]
        qw = queries[i].astype(np.float64) * index.weights
        for kk, m in rerank:
            scores = index.vectors[survivors, :kk].astype(np.float64) @ qw[:kk]
            macs += len(survivors) * kk + kk
            nbytes += len(survivors) * kk * index.itemsize
            survivors = survivors[_top_rows(scores[None, :], m)[0]]
        out.append(np.pad(survivors[:TOP], (0, TOP - len(survivors[:TOP])), constant_values=-1))
    cost.add(macs, nbytes, len(q))
    return np.stack(out)


def funnel_report(corpus: np.ndarray, queries: np.ndarray, eigenvalues: np.ndarray, dims: list[int]) -> dict:
    """eigtrain-eval's `retrieval_funnels` section: recall@10 against the exact top-10 under the eigenvalue-weighted
    score s at full d, with multiply-adds and bytes per query, for fixed prefixes at `dims`, MRL's funnel, the
    spectrum's funnels and the bound-based early stop (cuts at `dims`)."""
    d = corpus.shape[1]
    index = PrefixIndex(np.ascontiguousarray(corpus, dtype=np.float32), eigenvalues, cuts=tuple(dims))
    q = np.ascontiguousarray(queries, dtype=np.float32)
    reference = exact_top(index, q)
    funnels = {f"fixed k={k}": [(k, TOP)] for k in sorted({*dims, d}) if k <= d}
    funnels |= {f"MRL {SHORTLIST}@{k} -> {d}": [(k, SHORTLIST), (d, TOP)] for k in (16,) if k < d}
    funnels |= spectrum_funnels(index.weights, (index.vectors.astype(np.float64) ** 2).mean(axis=0))
    rows = []
    for name, stages in funnels.items():
        cost = Cost()
        rows.append({"method": name, "recall@10": recall_at(funnel_search(index, q, stages, cost), reference)})
        rows[-1].update(cost.per_query())
    cost, found, stops = Cost(), [], []
    for query in q:
        top, stop = bound_search(index, query, cost)
        found.append(top)
        stops.append(stop)
    bound = {"method": "bound early stop", "recall@10": recall_at(np.stack(found), reference), **cost.per_query()}
    rows.append({**bound, "mean_stop_k": float(np.mean(stops))})
    return {"reference": "exact top-10 under s = sum_i lambda_i psi_i(q) psi_i(x) at full d", "rows": rows}
