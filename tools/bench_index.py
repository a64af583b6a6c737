"""eigtrain-index on an embed output: recall@10 of each kind against exact search under the same similarity, build
time, and the build's peak memory (the RSS high-water, VmHWM, of a fresh process that only builds, beside its RSS
before the build: the imports).

    python tools/bench_index.py [--n 100000] [--dim 64] [--queries 200] [--digits-run RUN_DIR] [--out DIR]

Corpora: a synthetic one written as an embed output (n vectors of an ordered spectrum: coordinate j of a cluster
centre has variance 0.9^j, so the first coordinates carry most of the neighbourhood structure; queries are fresh
draws), and, given --digits-run (a trained run with its eigtrain-rr export, e.g. the quickstart), that run's
train split embedded by eigtrain-embed, its val split the queries. recall@10 = overlap of the index's top 10
with the exact top 10 (numpy, float64). Writes index.json and index.md to --out (default: a new temporary
directory; `--out benchmarks/` replaces the committed ones).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eigtrain.export.embed_read import iter_embeddings  # noqa: E402
from tests.support.embed_outputs import write_embed_output  # noqa: E402

KINDS = [("flat", "cosine"), ("funnel", "cosine"), ("funnel", "spectral"), ("funnel", "inner"), ("ivfpq", "cosine")]
BUILD = """
import json, re, sys, time
from pathlib import Path
from eigtrain.export.index_build import build
from eigtrain.export.index_config import IndexConfig
def status(key):  # kB; VmHWM is this process's own high-water (a fork's ru_maxrss starts at its parent's)
    return int(re.search(key + r":\\s+(\\d+)", Path("/proc/self/status").read_text())[1]) / 1024
before = status("VmRSS")
start = time.perf_counter()
build(IndexConfig(**json.loads(sys.argv[1])))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss_before_mb": before, "peak_rss_mb": status("VmHWM"),
                  "torch_imported": "torch" in sys.modules}))
"""


def synthetic(n: int, d: int, queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(corpus, queries, eigenvalues): clusters whose centre coordinate j has variance 0.9^j, noise at half that."""
    rng = np.random.default_rng(seed)
    lam = 0.9 ** np.arange(d)
    centres = rng.standard_normal((max(n // 100, 1), d)) * np.sqrt(lam)

    def draw(m: int) -> np.ndarray:
        return (centres[rng.integers(len(centres), size=m)] + 0.5 * rng.standard_normal((m, d)) * np.sqrt(lam)).astype(
            np.float32
        )

    return draw(n), draw(queries), lam


def digits(run_dir: str, work: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """The run's train split embedded (the corpus, an embed output), its val split (the queries)."""
    from eigtrain.export.corpus import main as embed
    from eigtrain.export.corpus import read_embeddings

    outs = {}
    for split in ("train", "val"):
        outs[split] = work / f"digits-{split}"
        assert embed([f"run_dir={run_dir}", f"out={outs[split]}", f"split={split}", "num_workers=0"]) == 0
    manifest = json.loads((outs["train"] / "manifest.json").read_text())
    return outs["train"], read_embeddings(outs["val"])[1].numpy(), np.asarray(manifest["eigenvalues"])


def exact(corpus: np.ndarray, queries: np.ndarray, similarity: str, lam: np.ndarray) -> np.ndarray:
    c, q = corpus.astype(np.float64), queries.astype(np.float64)
    if similarity == "cosine":
        c, q = c / np.linalg.norm(c, axis=1, keepdims=True), q / np.linalg.norm(q, axis=1, keepdims=True)
    elif similarity == "spectral":
        q = q * np.clip(lam, 0, None)
    return np.argsort(-(q @ c.T), axis=1)[:, :10]


def rows_of(source: Path, corpus: np.ndarray, queries: np.ndarray, lam: np.ndarray, work: Path, k: int) -> list:
    from eigtrain.export.index import open_index

    keys = [key for block_keys, _ in iter_embeddings(source, block_rows=1 << 20) for key in block_keys]
    rows = []
    for kind, similarity in KINDS:
        out = work / f"{source.name}-{kind}-{similarity}"
        config = {"embeddings": str(source), "out": str(out), "kind": kind, "similarity": similarity, "k": k}
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # faiss's threads spin against each other on a busy machine
        done = subprocess.run(
            [sys.executable, "-c", BUILD, json.dumps(config)], capture_output=True, text=True, env=env
        )
        if done.returncode:
            raise SystemExit(done.stderr.strip().splitlines()[-1])
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        index = open_index(out)
        found, _ = index.search(queries, 10)
        expected = [[keys[i] for i in row] for row in exact(corpus, queries, similarity, lam)]
        recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, expected)]))
        extra = {key: index.manifest.get(key) for key in ("k", "k_factor", "nlist", "pq_m", "nbits", "nprobe")}
        rows.append({"kind": kind, "similarity": similarity, "recall_at_10": round(recall, 4), **measured, **extra})
    return rows


def markdown(results: dict) -> str:
    """benchmarks/index.md from benchmarks/index.json."""
    rows = [r for corpus in results["corpora"].values() for r in corpus["rows"]]
    torch = "and torch" if any(r["torch_imported"] for r in rows) else "(not torch)"
    lines = [
        "# eigtrain-index: recall@10 against exact search, build time and memory",
        "",
        f"`python tools/bench_index.py {results['args']}` at commit {results['commit']} ({results['machine']}).",
        "recall@10: overlap of the index's top 10 with the exact top 10 under the same similarity. Peak RSS: the",
        f"high-water mark (VmHWM) of a fresh process that imports eigtrain and faiss {torch} and builds one index;",
        "before: its RSS after the imports. The corpus's features are n x d x 4 bytes.",
        "",
    ]
    for name, corpus in results["corpora"].items():
        lines += [f"## {name}: {corpus['info']}", "", "| kind | similarity | recall@10 | build s | peak RSS MB |"]
        lines += ["|---|---|---|---|---|"]
        for r in corpus["rows"]:
            shape = f" k={r['k']} x{r['k_factor']}" if r["kind"] == "funnel" else ""
            shape += f" nlist={r['nlist']} m={r['pq_m']} nbits={r['nbits']} nprobe={r['nprobe']}" if r["nlist"] else ""
            lines.append(
                f"| {r['kind']}{shape} | {r['similarity']} | {r['recall_at_10']:.3f} | {r['seconds']:.2f} "
                f"| {r['peak_rss_mb']:.0f} (before {r['rss_before_mb']:.0f}) |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--digits-run", default=None, help="a trained digits run with its eigtrain-rr export")
    p.add_argument("--out", default=None, help="where index.json and index.md go (default: a new temporary directory)")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench_index-"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    results: dict = {"args": " ".join(argv if argv is not None else sys.argv[1:]), "commit": commit.stdout.strip()}
    results["machine"] = f"faiss on 1 thread of {os.cpu_count()} CPU cores"
    results["corpora"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus, queries, lam = synthetic(a.n, a.dim, a.queries)
        source = write_embed_output(work / "synthetic", corpus, lam, chunk_size=16384)
        info = f"n={a.n}, d={a.dim}, {a.queries} fresh queries, coordinate variance 0.9^j"
        results["corpora"]["synthetic"] = {"info": info, "rows": rows_of(source, corpus, queries, lam, work, a.k)}
        if a.digits_run:
            source, queries, lam = digits(a.digits_run, work)
            corpus = np.concatenate([block for _, block in iter_embeddings(source)])
            info = (
                f"run {Path(a.digits_run).name!r}'s train split (n={len(corpus)}, d={corpus.shape[1]}), val the queries"
            )
            results["corpora"]["digits"] = {"info": info, "rows": rows_of(source, corpus, queries, lam, work, a.k)}
    out.mkdir(parents=True, exist_ok=True)
    from eigtrain import safe_files

    safe_files.write_text(out / "index.json", json.dumps(results, indent=2) + "\n")
    safe_files.write_text(out / "index.md", markdown(results))
    print(json.dumps(results, indent=2))
    print(f"wrote {out / 'index.json'} and {out / 'index.md'}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
