"""Issue 55: eigtrain-index and the streaming reader. On a tiny digits run's embed output (8 chunks): iter_embeddings
gives read_embeddings' rows block by block; each kind builds and finds the exact neighbours (flat: exactly, the
funnel at k = 4 of 16: recall@10 >= 0.95, IVF-PQ: most); a negative eigenvalue under similarity=spectral weighs
nothing instead of giving NaN; bad settings, a missing output and a missing faiss are one line each."""

import json
import shutil
import sys
import tracemalloc

import numpy as np
import pytest

from eigtrain.commands import index as index_command
from eigtrain.export.command import main as rr_main
from eigtrain.export.corpus import main as embed_main
from eigtrain.export.corpus import read_embeddings
from eigtrain.export.embed_read import iter_embeddings
from eigtrain.export.index import open_index
from tests.support.embed_outputs import write_embed_output
from tests.support.runs import overrides

faiss = pytest.importorskip("faiss")


@pytest.fixture(autouse=True)
def one_thread():
    """faiss's OpenMP threads spin against each other on a busy 2-core machine (k-means 250x slower)."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def embedded(digits_root, tmp_path_factory):
    """A 2-step digits run, its Rayleigh-Ritz export and its validation split embedded in 8 chunks (359 x 16)."""
    from eigtrain.train.command import compose_config, run

    root = tmp_path_factory.mktemp("index")
    run(compose_config(overrides(root / "run", digits_root, "steps=2", "checkpoint_every=2")))
    assert rr_main([f"run_dir={root / 'run'}", "batch_size=256", "num_workers=0"]) == 0
    out = root / "emb"
    args = [f"run_dir={root / 'run'}", f"out={out}", "split=val", "chunk_size=50", "num_workers=0"]
    assert embed_main(args) == 0
    return out


def _exact(queries, corpus, weights=None, top=10):
    """Row indices of the `top` best by cosine (weights None) or by sum_j w_j q_j x_j, best first; and the scores."""
    if weights is None:
        queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
        corpus = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
        weights = np.ones(corpus.shape[1])
    scores = (queries * weights) @ corpus.T
    best = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    return best, np.take_along_axis(scores, best, axis=1)


def _recall(found, expected) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, expected)]))


def _build(tmp_path, embeddings, name, *args) -> int:
    return index_command([f"embeddings={embeddings}", f"out={tmp_path / name}", *args])


def test_iter_embeddings_streams_what_read_embeddings_reads(embedded):
    keys, features = read_embeddings(embedded)
    blocks = list(iter_embeddings(embedded, dims=6, block_rows=16))
    assert len({tuple(k) for k, _ in blocks}) == len(blocks) and max(len(b) for _, b in blocks) == 16
    assert all(b.dtype == np.float32 and b.shape == (len(k), 6) for k, b in blocks)
    streamed = dict(zip(sum((k for k, _ in blocks), []), np.concatenate([b for _, b in blocks])))
    assert sorted(streamed) == keys
    np.testing.assert_array_equal(np.stack([streamed[k] for k in keys]), features[:, :6].numpy())


def test_float16_chunks_come_as_float32_blocks_and_memory_stays_at_a_block(tmp_path):
    """A 20,000 x 128 output in two chunks of 5 MB each, read 500 rows (64 KB as float16 -> 256 KB) at a time: the
    reader's allocations stay far below one chunk (the keys of a chunk, ~0.6 MB, are held with it)."""
    x = np.random.default_rng(0).standard_normal((20000, 128)).astype(np.float16)
    out = write_embed_output(tmp_path / "emb", x, chunk_size=10000, dtype="float16")
    tracemalloc.start()
    rows = 0
    for keys, block in iter_embeddings(out, block_rows=500):
        assert block.dtype == np.float32 and len(block) <= 500
        np.testing.assert_array_equal(block, x[rows : rows + len(block)].astype(np.float32))
        rows += len(block)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rows == 20000 and peak < 2_500_000, peak
    assert read_embeddings(out)[1].numpy().dtype == np.float16  # read_embeddings keeps the stored dtype


def test_flat_finds_the_exact_neighbours_and_the_funnel_almost(embedded, tmp_path):
    keys, features = read_embeddings(embedded)
    x = features.numpy()
    expected, scores = _exact(x[:60], x)
    assert _build(tmp_path, embedded, "flat", "kind=flat") == 0
    flat = open_index(tmp_path / "flat")
    found, found_scores = flat.search(x[:60], 10)
    assert _recall(found, [[keys[i] for i in row] for row in expected]) == 1.0
    np.testing.assert_allclose(found_scores, scores, atol=1e-5)
    assert _build(tmp_path, embedded, "funnel", "kind=funnel", "k=8", "k_factor=20") == 0
    funnel = open_index(tmp_path / "funnel")
    assert funnel.manifest["embeddings"]["manifest_sha256"] and funnel.manifest["n"] == len(keys) == 359
    assert faiss.downcast_index(funnel.index.index).k_factor == 20  # read back from the file
    found, _ = funnel.search(x[:60], 10)
    # the funnel in numpy: a shortlist of 10 x 20 by cosine at the first 8, reranked by cosine at all 16
    shortlist, _ = _exact(x[:60, :8], x[:, :8], top=200)
    full = _exact(x[:60], x, top=len(x))[0]
    emulated = [[i for i in order if i in set(short)][:10] for order, short in zip(full, shortlist)]
    assert [sorted(row) for row in found] == [sorted(keys[i] for i in row) for row in emulated]
    assert _recall(found, [[keys[i] for i in row] for row in expected]) >= 0.95
    assert _recall(shortlist[:, :10], expected) < 0.6  # the first stage alone: the rerank is what recovers it


def test_ivfpq_builds_on_a_sample_and_finds_most_neighbours(embedded, tmp_path):
    keys, features = read_embeddings(embedded)
    x = features.numpy()
    expected, _ = _exact(x[:60], x)
    assert _build(tmp_path, embedded, "pq", "kind=ivfpq", "train_rows=300", "nprobe=8") == 0
    index = open_index(tmp_path / "pq")
    assert index.manifest["nlist"] <= 300 // 39 and index.manifest["pq_m"] == 8 and index.manifest["nbits"] == 5
    assert faiss.extract_index_ivf(index.index).nprobe == 8  # the search settings travel in the file
    found, scores = index.search(x[:60], 10)
    assert _recall(found, [[keys[i] for i in row] for row in expected]) >= 0.5 and np.isfinite(scores).all()


def test_a_negative_eigenvalue_weighs_nothing_under_spectral(embedded, tmp_path):
    emb = tmp_path / "emb"
    shutil.copytree(embedded, emb)
    manifest = json.loads((emb / "manifest.json").read_text())
    manifest["eigenvalues"][2] = -0.007
    (emb / "manifest.json").write_text(json.dumps(manifest))
    keys, features = read_embeddings(emb)
    x = features.numpy()
    weights = np.clip(manifest["eigenvalues"], 0, None)
    expected, scores = _exact(x[:40], x, weights)
    for kind in ("flat", "funnel"):
        assert _build(tmp_path, emb, kind, f"kind={kind}", "similarity=spectral", "k=8") == 0
        found, found_scores = open_index(tmp_path / kind).search(x[:40], 10)
        assert np.isfinite(found_scores).all()
        assert _recall(found, [[keys[i] for i in row] for row in expected]) >= (1.0 if kind == "flat" else 0.9)
    np.testing.assert_allclose(found_scores[:, 0], scores[:, 0], rtol=1e-4)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_refusals_are_one_line(embedded, tmp_path, capsys, monkeypatch):
    assert index_command([f"embeddings={embedded}", f"out={tmp_path / 'o'}", "kind=hnsw"]) == 2
    assert "kind='hnsw'" in _one_line(capsys)
    assert index_command([f"embeddings={tmp_path / 'missing'}", f"out={tmp_path / 'o'}"]) == 2
    assert "no eigtrain-embed output" in _one_line(capsys)
    assert _build(tmp_path, embedded, "o", "dims=17") == 2 and "dims=17 must lie in 1..16" in _one_line(capsys)
    plain = write_embed_output(tmp_path / "plain", np.ones((20, 4), np.float32), chunk_size=8)  # no eigenvalues
    assert _build(tmp_path, plain, "o", "similarity=spectral", "k=2") == 2 and "eigenvalues" in _one_line(capsys)
    assert _build(tmp_path, embedded, "o", "kind=flat") == 0
    capsys.readouterr()
    assert _build(tmp_path, embedded, "o", "kind=flat") == 2 and "overwrite=true" in _one_line(capsys)
    (tmp_path / "o" / "index.faiss").write_bytes(b"changed")
    with pytest.raises(ValueError, match="changed since eigtrain-index wrote it"):
        open_index(tmp_path / "o")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert _build(tmp_path, embedded, "mine") == 2 and "notes.txt" in _one_line(capsys)
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss were not installed
    assert _build(tmp_path, embedded, "o2") == 2 and "pip install 'eigtrain[faiss]'" in _one_line(capsys)
    assert not (tmp_path / "o2").exists()


def test_the_index_is_built_without_torch(tmp_path):
    """eigtrain-index reads the chunks with numpy and safetensors alone: torch's import (seconds, ~500 MB) is not
    part of building an index."""
    import subprocess

    from tests.support.runs import clean_env

    source = write_embed_output(tmp_path / "emb", np.eye(8, dtype=np.float32), chunk_size=3)
    code = (
        "import sys; from eigtrain.commands import index; "
        f"code = index(['embeddings={source}', 'out={tmp_path / 'o'}', 'k=4']); "
        "print(code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=120)
    assert done.stdout.split()[-2:] == ["0", "False"], done.stdout + done.stderr


def test_the_committed_benchmark_table_is_the_json_it_was_made_from():
    """benchmarks/index.md is generated from benchmarks/index.json (tools/bench_index.py) at a commit of this repo."""
    import importlib.util
    import subprocess

    from tests.support.runs import REPO

    spec = importlib.util.spec_from_file_location("bench_index", REPO / "tools" / "bench_index.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = json.loads((REPO / "benchmarks" / "index.json").read_text())
    assert results["corpora"]["synthetic"]["info"].startswith("n=100000")
    committed = subprocess.run(["git", "cat-file", "-e", f"{results['commit']}^{{commit}}"], cwd=REPO)
    assert committed.returncode == 0, f"benchmarks/index.json names commit {results['commit']}, not in this repository"
    table = REPO / "benchmarks" / "index.md"
    assert table.read_text() == bench.markdown(results)
