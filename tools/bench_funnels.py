"""Adaptive retrieval planned by the spectrum (issue 36.3): recall@10 against multiply-adds and bytes per query for
fixed prefixes, MRL's hand-set funnels, the spectrum's funnels, the bound-based early stop, PCA prefixes under the
same funnels, and IVF-PQ shortlists, on a synthetic corpus and (given an export's features) on digits.

Two references, never mixed: `s` is the eigenvalue-weighted score sum_i lambda_i psi_i(q) psi_i(x) at full d;
`ip` is the plain inner product psi(q) . psi(x) at full d. recall@10 = the share of the reference's exact top-10
found. Prints the JSON; writes benchmarks/funnels.md and benchmarks/funnels.png.

    python tools/bench_funnels.py [--n 100000] [--dim 64] [--queries 200] [--digits-run RUN_DIR]

The committed table's digits rows: the quickstart's run (eigtrain-train experiment=quickstart run_dir=RUN_DIR
data.root=DIR logging.wandb.mode=disabled cpu_threads=1; eigtrain-rr run_dir=RUN_DIR), with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from eigtrain.evaluate.funnels import (
    SHORTLIST,
    TOP,
    Cost,
    PrefixIndex,
    bound_search,
    build_ivfpq,
    exact_top,
    funnel_search,
    ivfpq_funnel_search,
    pca_axes,
    recall_at,
    spectrum_funnels,
)

OUT = Path(__file__).resolve().parents[1] / "benchmarks"


def synthetic(n: int, d: int, queries: int, seed: int = 0):
    """Orthonormal coordinates (E[psi psi^T] = I, Gaussian) and a known decaying spectrum lambda_i = exp(-0.08 (i-1));
    the queries are drawn the same way."""
    rng = np.random.default_rng(seed)
    corpus = rng.standard_normal((n, d), dtype=np.float32)
    q = rng.standard_normal((queries, d), dtype=np.float32)
    return corpus, q, np.exp(-0.08 * np.arange(d))


def _row(name, found, reference, cost: Cost, **extra) -> dict:
    return {"method": name, "recall@10": recall_at(found, reference), **cost.per_query(), **extra}


def _funnel_rows(label: str, index: PrefixIndex, q, reference, funnels: dict) -> list[dict]:
    rows = []
    for name, stages in funnels.items():
        cost = Cost()
        rows.append(_row(f"{label}{name}", funnel_search(index, q, stages, cost), reference, cost))
    return rows


def _bound_row(label: str, index: PrefixIndex, q, reference) -> dict:
    cost, found, stops = Cost(), [], []
    for query in q:
        top, stop = bound_search(index, query, cost)
        found.append(top)
        stops.append(stop)
    return _row(
        f"{label}bound early stop (cuts {list(index.cuts)})",
        np.stack(found),
        reference,
        cost,
        mean_stop_k=float(np.mean(stops)),
    )


def _pq_rows(index: PrefixIndex, q, reference, ks: dict, nlist: int, nprobe: int) -> list[dict]:
    rows = []
    for name, k in ks.items():
        pq, cost = build_ivfpq(index, k, nlist, nprobe), Cost()
        found = ivfpq_funnel_search(index, pq, q, [(index.dim, TOP)], cost)
        rows.append(
            _row(
                f"IVF-PQ {name} {SHORTLIST}@{k} -> {index.dim} (nlist {nlist}, nprobe {nprobe}, "
                f"{pq.subquantizers} bytes/code)",
                found,
                reference,
                cost,
            )
        )
    return rows


def corpus_rows(corpus, q, eigenvalues, nlist: int, nprobe: int) -> dict:
    """Every row under both references for one corpus."""
    d = corpus.shape[1]
    ks = [k for k in (2, 4, 8, 16, 32) if k < d] + [d]
    fixed = {f"fixed k={k}": [(k, TOP)] for k in ks}
    hand = {f"MRL {SHORTLIST}@{k} -> {d}": [(k, SHORTLIST), (d, TOP)] for k in (8, 16) if k < d}
    spectrum = spectrum_funnels(eigenvalues, (corpus.astype(np.float64) ** 2).mean(axis=0))
    funnels = {**fixed, **hand, **spectrum}
    cuts = tuple(k for k in (4, 8, 16, 24, 32, 48) if k < d)
    out = {}
    for ref, weights in (("s", eigenvalues), ("ip", np.ones(d))):
        index = PrefixIndex(corpus, weights, cuts=cuts)
        reference = exact_top(index, q)
        rows = _funnel_rows("", index, q, reference, funnels)
        rows.append(_bound_row("", index, q, reference))
        if np.all(weights >= 0):  # PCA of the embedding whose inner product is the reference: sqrt(w) psi
            root = np.sqrt(weights)
            axes = pca_axes(corpus * root)  # fitted on the corpus only, applied to corpus and queries
            pca = PrefixIndex(((corpus * root) @ axes).astype(np.float32), np.ones(d), cuts=cuts)
            rows += _funnel_rows("PCA ", pca, ((q * root) @ axes).astype(np.float32), reference, funnels)
        k1 = next(s for name, s in spectrum.items() if name.count("->") == 1)[0][0]
        rows += _pq_rows(index, q, reference, {**({"hand": 16} if 16 < d else {}), "spectrum": k1}, nlist, nprobe)
        out[ref] = rows
    return out


def digits_features(run_dir: str):
    """A trained run's RR features (its export at run_dir/rr): the train split is the corpus, the val split the
    queries, the export's eigenvalues the weights (as eigtrain-eval computes them)."""
    import torch

    from eigtrain.export.embed import embed_split, open_run
    from eigtrain.export.files import load_head

    run = open_run(run_dir)
    head = load_head(Path(run_dir) / "rr", dtype=torch.float64)
    corpus, q = (head(embed_split(run, s)[0].double()).float().numpy() for s in ("train", "val"))
    return corpus, q, head.eigenvalues.double().numpy()


def write_markdown(results: dict, path: Path) -> None:
    lines = ["<!-- generated by tools/bench_funnels.py; do not edit -->", "# Adaptive retrieval: recall@10 vs cost", ""]
    lines += [
        "recall@10: the share of the reference's exact top-10 (at full d) a method returns. Multiply-adds and bytes",
        "are counted per query (eigtrain/evaluate/funnels.py): a stage reranking m vectors at k costs m*k (from scratch), the",
        "bound search one multiply per bound check and 4 bytes per stored tail norm, IVF-PQ its coarse search,",
        "look-up tables and one look-up-add per sub-quantizer per scanned code; top-m selection is not counted.",
        f"MRL: shortlist {SHORTLIST} at k, rerank at d. spectrum: k1, k2 the smallest prefixes whose tails hold at",
        "most 10 % / 1 % of sum lambda_i^2 E[psi_i^2]^2 (fixed before any recall was measured), the same shortlists",
        "(second stage 50). PCA: principal axes of sqrt(lambda) psi (reference s) or psi (reference ip), fitted on",
        "the corpus, the same funnels. bound: exact; mean stop k = the mean cut where the top-10 was proved.",
        "fp32 vectors.",
        "",
    ]
    for corpus, refs in results.items():
        info = refs["info"]
        lines.append(f"## {corpus}: {info}")
        for ref, rows in refs.items():
            if ref == "info":
                continue
            title = "s = sum lambda_i psi_i(q) psi_i(x)" if ref == "s" else "plain inner product psi(q).psi(x)"
            lines += ["", f"Reference: exact top-10 under {title} at full d.", ""]
            lines += ["| method | recall@10 | multiply-adds / query | bytes / query |", "|---|---:|---:|---:|"]
            for r in rows:
                stop = f" (mean stop k {r['mean_stop_k']:.1f})" if "mean_stop_k" in r else ""
                lines.append(
                    f"| {r['method']}{stop} | {r['recall@10']:.3f} | {r['macs_per_query']:,.0f} | "
                    f"{r['bytes_per_query']:,.0f} |"
                )
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def _family(method: str) -> str:
    for key in ("IVF-PQ", "PCA", "bound", "spectrum", "MRL", "fixed"):
        if key in method:
            return key
    return "other"


def plot(results: dict, path: Path) -> None:
    """recall@10 against multiply-adds (top row) and bytes (bottom row) per query, one column per corpus and reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    panels = [(c, ref) for c, refs in results.items() for ref in refs if ref != "info"]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 7), squeeze=False)
    markers = {"fixed": "o", "MRL": "s", "spectrum": "*", "bound": "D", "PCA": "x", "IVF-PQ": "^", "other": "."}
    for col, (corpus, ref) in enumerate(panels):
        for row, (key, label) in enumerate((("macs_per_query", "multiply-adds"), ("bytes_per_query", "bytes"))):
            ax = axes[row][col]
            for fam, marker in markers.items():
                rows = [r for r in results[corpus][ref] if _family(r["method"]) == fam]
                if rows:
                    size = 70 if fam == "spectrum" else 30
                    ax.scatter([r[key] for r in rows], [r["recall@10"] for r in rows], marker=marker, label=fam, s=size)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(xlabel=f"{label} per query", ylabel="recall@10", title=f"{corpus}: reference {ref}", ylim=(0, 1.02))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--digits-run", default=None, help="a trained digits run with its RR export (eigtrain-rr)")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    corpus, q, lam = synthetic(a.n, a.dim, a.queries)
    nlist = min(256, max(1, a.n // 39))  # faiss asks for 39 training vectors per list
    results = {"synthetic": corpus_rows(corpus, q, lam, nlist=nlist, nprobe=16)}
    results["synthetic"]["info"] = f"n={a.n}, d={a.dim}, {a.queries} queries, lambda_i = exp(-0.08 (i-1))"
    if a.digits_run:
        corpus, q, lam = digits_features(a.digits_run)
        results["digits"] = corpus_rows(corpus, q, lam, nlist=32, nprobe=4)
        results["digits"]["info"] = (
            f"RR features of run {Path(a.digits_run).name!r}, train split the corpus, val the queries: n={len(corpus)}, d={corpus.shape[1]}, {len(q)} queries"
        )
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    write_markdown(results, out / "funnels.md")
    plot(results, out / "funnels.png")
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
