"""Adaptive retrieval planned by the spectrum (issue 36.3): recall@10 against multiply-adds and bytes per query for
fixed prefixes, MRL's hand-set funnels, the spectrum's funnels, the bound-based early stop, PCA prefixes under the
same funnels, and IVF-PQ shortlists, on two synthetic corpora and (given a digits run or its data) on digits.

Two references, never mixed: `s` is the eigenvalue-weighted score sum_i lambda_i psi_i(q) psi_i(x) at full d;
`ip` is the plain inner product psi(q) . psi(x) at full d. recall@10 = the share of the reference's exact top-10
found. Corpora: `synthetic`, whitened coordinates (E[psi psi^T] = I, as RR makes them on its own data: PCA's axes
are the eigenbasis, so PCA and the RR prefixes coincide), and `mixed`, the same spectrum over a corpus whose
covariance is anisotropic in a randomly rotated basis (features met on data they were not whitened on: PCA's
axes are not the eigenbasis, so the two orders differ).

    python tools/bench_funnels.py [--n 100000] [--dim 64] [--queries 200] [--digits-data DIR | --digits-run RUN]
        [--out DIR]

--digits-data trains the quickstart on that shard folder (e.g. data/digits, written by `eigtrain-shards
source=digits`) in a temporary directory: `eigtrain-train experiment=quickstart run_dir=RUN data.root=DIR
logging.wandb.mode=disabled cpu_threads=1` then `eigtrain-rr run_dir=RUN`, with OMP_NUM_THREADS=1 (the commands
are recorded). Writes funnels.json (rows, the commit, the command lines), funnels.md (rendered from the JSON by
`markdown`) and funnels.png to --out (default: a new temporary directory; `--out benchmarks/` replaces the
committed ones; tests/evaluate/test_funnels.py checks the committed table is its JSON's rendering).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eigtrain.evaluate.funnels import (  # noqa: E402
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

TRAIN = ["experiment=quickstart", "logging.wandb.mode=disabled", "cpu_threads=1"]
LAUNCH = "import sys; from eigtrain import commands; sys.argv[0] = {0!r}; sys.exit(getattr(commands, {1!r})())"


def synthetic(n: int, d: int, queries: int, seed: int = 0):
    """Orthonormal coordinates (E[psi psi^T] = I, Gaussian) and a known decaying spectrum lambda_i = exp(-0.08 (i-1));
    the queries are drawn the same way."""
    rng = np.random.default_rng(seed)
    corpus = rng.standard_normal((n, d), dtype=np.float32)
    q = rng.standard_normal((queries, d), dtype=np.float32)
    return corpus, q, np.exp(-0.08 * np.arange(d))


def mixed(n: int, d: int, queries: int, seed: int = 1):
    """The same spectrum; corpus and queries psi = z diag(sqrt mu) R^T (z standard Gaussian, R a random rotation,
    mu_j = exp(-0.08 (j-1)) scaled to mean 1): E[psi psi^T] = R diag(mu) R^T, whose principal axes are R's columns,
    not the eigenbasis, so the order of variance is not the order of lambda."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    mu = np.exp(-0.08 * np.arange(d))
    mixing = (np.sqrt(mu / mu.mean())[:, None] * rotation.T).astype(np.float32)
    corpus = rng.standard_normal((n, d), dtype=np.float32) @ mixing
    q = rng.standard_normal((queries, d), dtype=np.float32) @ mixing
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


def make_digits_run(data_root: str, work: Path) -> tuple[str, list[str]]:
    """Trains the quickstart on data_root and exports its RR head, in `work`; returns the run and the command lines
    (the temporary run directory written as RUN)."""
    run_dir, root = str(work / "run"), os.path.abspath(data_root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    commands = []
    for script, name, args in (
        ("eigtrain-train", "train", [TRAIN[0], f"run_dir={run_dir}", f"data.root={root}", *TRAIN[1:]]),
        ("eigtrain-rr", "rr", [f"run_dir={run_dir}"]),
    ):
        shown = [arg.replace(run_dir, "RUN").replace(root, data_root) for arg in args]
        commands.append(shlex.join(["OMP_NUM_THREADS=1", script, *shown]))
        done = subprocess.run([sys.executable, "-c", LAUNCH.format(script, name), *args], env=env, cwd=work)
        if done.returncode:
            raise SystemExit(f"bench_funnels: {commands[-1]} failed (exit {done.returncode})")
    return run_dir, commands


def git_state() -> dict:
    """The commit the rows were made at and whether tracked files differed from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO, check=True).stdout.strip()

    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}


INTRO = [
    "recall@10: the share of the reference's exact top-10 (at full d) a method returns. Multiply-adds and bytes",
    "are counted per query (eigtrain.evaluate.funnels): a stage reranking m vectors at k costs m*k (from scratch),",
    "the bound search one multiply per bound check and 4 bytes per stored tail norm, IVF-PQ its coarse search,",
    "look-up tables and one look-up-add per sub-quantizer per scanned code; top-m selection is not counted.",
    f"MRL: shortlist {SHORTLIST} at k, rerank at d. spectrum: k1, k2 the smallest prefixes whose tails hold at",
    "most 10 % / 1 % of sum lambda_i^2 E[psi_i^2]^2 (fixed before any recall was measured), the same shortlists",
    "(second stage 50). PCA: principal axes of sqrt(lambda) psi (reference s) or psi (reference ip), fitted on",
    "the corpus, the same funnels. bound: exact; mean stop k = the mean cut where the top-10 was proved.",
    "fp32 vectors. `synthetic`'s coordinates are whitened (PCA's axes are the eigenbasis: PCA and the prefixes",
    "coincide); `mixed` has the same spectrum over a corpus anisotropic in a rotated basis (PCA's axes are not the",
    "eigenbasis: the rows show what ordering by lambda costs when the features are not white on the corpus).",
]


def markdown(results: dict) -> str:
    """benchmarks/funnels.md from benchmarks/funnels.json."""
    dirty = " with local changes" if results["dirty"] else ""
    lines = ["<!-- generated by tools/bench_funnels.py from funnels.json; do not edit -->"]
    lines += ["# Adaptive retrieval: recall@10 vs cost", "", f"Made at commit {results['commit']}{dirty}:", ""]
    lines += ["```", *results["commands"], "```", "", *INTRO, ""]
    for corpus, refs in results["corpora"].items():
        lines.append(f"## {corpus}: {refs['info']}")
        for ref in ("s", "ip"):
            title = "s = sum lambda_i psi_i(q) psi_i(x)" if ref == "s" else "plain inner product psi(q).psi(x)"
            lines += ["", f"Reference: exact top-10 under {title} at full d.", ""]
            lines += ["| method | recall@10 | multiply-adds / query | bytes / query |", "|---|---:|---:|---:|"]
            for r in refs[ref]:
                stop = f" (mean stop k {r['mean_stop_k']:.1f})" if "mean_stop_k" in r else ""
                lines.append(
                    f"| {r['method']}{stop} | {r['recall@10']:.3f} | {r['macs_per_query']:,.0f} | "
                    f"{r['bytes_per_query']:,.0f} |"
                )
        lines.append("")
    return "\n".join(lines)


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

    from eigtrain import safe_files

    corpora = results["corpora"]
    panels = [(c, ref) for c in corpora for ref in ("s", "ip")]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.5 * len(panels), 7), squeeze=False)
    markers = {"fixed": "o", "MRL": "s", "spectrum": "*", "bound": "D", "PCA": "x", "IVF-PQ": "^", "other": "."}
    for col, (corpus, ref) in enumerate(panels):
        for row, (key, label) in enumerate((("macs_per_query", "multiply-adds"), ("bytes_per_query", "bytes"))):
            ax = axes[row][col]
            for fam, marker in markers.items():
                rows = [r for r in corpora[corpus][ref] if _family(r["method"]) == fam]
                if rows:
                    size = 70 if fam == "spectrum" else 30
                    ax.scatter([r[key] for r in rows], [r["recall@10"] for r in rows], marker=marker, label=fam, s=size)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(xlabel=f"{label} per query", ylabel="recall@10", title=f"{corpus}: reference {ref}", ylim=(0, 1.02))
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    safe_files.write_with(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)


def _corpora(a: argparse.Namespace, work: Path) -> tuple[dict, list[str]]:
    nlist = min(256, max(1, a.n // 39))  # faiss asks for 39 training vectors per list
    corpora, commands = {}, []
    for name, draw, info in (
        ("synthetic", synthetic, "whitened coordinates"),
        ("mixed", mixed, "psi = z diag(sqrt mu) R^T, R a random rotation, mu_j = exp(-0.08 (j-1)) at mean 1"),
    ):
        corpora[name] = corpus_rows(*draw(a.n, a.dim, a.queries), nlist=nlist, nprobe=16)
        corpora[name]["info"] = f"n={a.n}, d={a.dim}, {a.queries} queries, lambda_i = exp(-0.08 (i-1)), {info}"
    run_dir = a.digits_run
    if run_dir:
        commands = [f"# the digits run {run_dir!r} was made elsewhere (its environment.json says how)"]
    if a.digits_data:
        run_dir, commands = make_digits_run(a.digits_data, work)
    if run_dir:
        corpus, q, lam = digits_features(run_dir)
        corpora["digits"] = corpus_rows(corpus, q, lam, nlist=32, nprobe=4)
        corpora["digits"]["info"] = (
            f"RR features of the quickstart run, train split the corpus, val the queries: n={len(corpus)}, "
            f"d={corpus.shape[1]}, {len(q)} queries"
        )
    return corpora, commands


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--queries", type=int, default=200)
    digits = p.add_mutually_exclusive_group()
    digits.add_argument("--digits-data", default=None, help="digits shards: train the quickstart on them here")
    digits.add_argument("--digits-run", default=None, help="a trained digits run with its RR export (eigtrain-rr)")
    p.add_argument("--out", default=None, help="where funnels.json/.md/.png go (default: a new temporary directory)")
    argv = sys.argv[1:] if argv is None else argv
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench_funnels-"))
    results: dict = git_state()
    threads = os.environ.get("OMP_NUM_THREADS")
    bench = shlex.join(["python", "tools/bench_funnels.py", *argv])
    with tempfile.TemporaryDirectory(prefix="bench_funnels-run-") as tmp:
        results["corpora"], commands = _corpora(a, Path(tmp))
    results["commands"] = [f"OMP_NUM_THREADS={threads} {bench}" if threads else bench, *commands]
    from eigtrain import safe_files

    out.mkdir(parents=True, exist_ok=True)
    safe_files.write_text(out / "funnels.json", json.dumps(results, indent=1) + "\n")
    safe_files.write_text(out / "funnels.md", markdown(results))
    plot(results, out / "funnels.png")
    print(json.dumps(results, indent=1))
    print(f"wrote {out / 'funnels.json'}, funnels.md and funnels.png", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
