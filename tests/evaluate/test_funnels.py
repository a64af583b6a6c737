"""The funnels' search (issue 36.3): the tail bound is an upper bound for any order and sign of the weights, and the
bound-based early stop returns exactly the full-size top-10 wherever it stops, on data where the bound is tight
and where it is loose."""

import numpy as np
import pytest

from eigtrain.evaluate.funnels import (
    Cost,
    PrefixIndex,
    bound_search,
    exact_top,
    funnel_cost,
    funnel_search,
    pca_axes,
    recall_at,
    spectrum_cuts,
    upward_tail_norms,
)
from tests.support.runs import REPO


def _data(kind: str, seed: int, n: int = 600, d: int = 24):
    """(corpus, queries, weights): 'decaying' a sorted positive spectrum on isotropic features (a tight bound late),
    'loose' a flat spectrum (the bound proves nothing before d), 'aligned' tails all along one direction (the
    Cauchy-Schwarz bound holds with equality), 'signed' unsorted weights with negative values."""
    rng = np.random.default_rng(seed)
    x, q = rng.standard_normal((n, d)), rng.standard_normal((40, d))
    w = 0.6 ** np.arange(d)
    if kind == "loose":
        w = np.ones(d)
    elif kind == "aligned":
        direction = rng.standard_normal(d - 6)
        x[:, 6:] = rng.standard_normal((n, 1)) * direction
        q[:, 6:] = np.abs(rng.standard_normal((40, 1))) * direction
        w = np.concatenate([0.6 ** np.arange(6), np.full(d - 6, 0.05)])
    elif kind == "signed":
        w = rng.permutation(0.7 ** np.arange(d) * rng.choice([-1.0, 1.0], size=d))
    return x.astype(np.float32), q.astype(np.float32), w


@pytest.mark.parametrize("kind", ["decaying", "loose", "aligned", "signed"])
def test_tail_bound_is_an_upper_bound(kind):
    x, q, w = _data(kind, seed=1)
    index = PrefixIndex(x, w, cuts=(2, 5, 9, 17))
    q_tail = upward_tail_norms(q, index.cuts).astype(np.float64)
    worst = 0.0
    for c, k in enumerate(index.cuts):
        tail = (q[:, k:].astype(np.float64) * w[k:]) @ x[:, k:].astype(np.float64).T
        bound = index.tail_scale[c] * np.outer(q_tail[:, c], index.tail_norms[:, c].astype(np.float64))
        assert np.all(np.abs(tail) <= bound + 1e-12), (kind, k)
        worst = max(worst, float((np.abs(tail) / np.maximum(bound, 1e-300)).max()))
    if kind == "aligned":
        assert worst > 0.999  # tight: the tails are parallel, so the bound is attained


def test_tail_scale_is_the_largest_weight_beyond_the_cut_not_the_next_one():
    w = np.array([3.0, -1.0, 0.5, -2.0, 0.1])
    index = PrefixIndex(np.ones((3, 5), dtype=np.float32), w, cuts=(1, 2, 4))
    assert index.tail_scale.tolist() == [2.0, 2.0, 0.1, 0.0]


@pytest.mark.parametrize("kind", ["decaying", "loose", "aligned", "signed"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bound_search_returns_the_exact_full_size_top10_wherever_it_stops(kind, seed):
    x, q, w = _data(kind, seed)
    index = PrefixIndex(x, w, cuts=(1, 2, 4, 8, 12, 16, 20))
    reference = exact_top(index, q)
    cost, stops = Cost(), []
    for i in range(len(q)):
        found, stop = bound_search(index, q[i], cost)
        stops.append(stop)
        assert set(found.tolist()) == set(reference[i].tolist()), (kind, seed, i, stop)
        assert found.tolist() == reference[i].tolist()
    if kind in ("decaying", "aligned"):
        assert min(stops) < x.shape[1]  # not vacuous: the bound proved the top-10 before d on some query
    if kind == "decaying":
        assert cost.macs / cost.queries < len(x) * x.shape[1]  # and it did so below the exhaustive cost


def test_bound_search_with_ties_and_duplicates_returns_a_valid_top10():
    x, q, w = _data("decaying", seed=3, n=100)
    x = np.concatenate([x, x[:30]])  # exact duplicates: equal scores at every cut
    index = PrefixIndex(x, w, cuts=(2, 4, 8))
    full = (q.astype(np.float64) * w) @ x.astype(np.float64).T
    for i in range(len(q)):
        found, _ = bound_search(index, q[i], Cost())
        tenth = np.sort(full[i])[-10]
        assert len(set(found.tolist())) == 10 and np.all(full[i, found] >= tenth - 1e-9)


def test_funnel_with_full_shortlist_is_exact_and_counts_its_cost():
    x, q, w = _data("decaying", seed=4)
    index = PrefixIndex(x, w)
    cost = Cost()
    found = funnel_search(index, q, [(4, len(x)), (24, 10)], cost)
    assert recall_at(found, exact_top(index, q)) == 1.0
    assert cost.macs / cost.queries == len(x) * 4 + 4 + len(x) * 24 + 24
    assert funnel_cost(1000, [(16, 200), (64, 10)], 4) == (1000 * 16 + 16 + 200 * 64 + 64, 4 * (1000 * 16 + 200 * 64))


def test_spectrum_cuts_and_pca_keep_the_full_size_scores():
    w = np.array([1.0, 0.5, 0.1, 0.01])
    assert spectrum_cuts(w, np.ones(4), shares=(0.3, 0.05, 0.0)) == [1, 2, 4]
    x, _, _ = _data("loose", seed=5, n=50, d=6)
    rotated = x.astype(np.float64) @ pca_axes(x)
    np.testing.assert_allclose(rotated @ rotated.T, x.astype(np.float64) @ x.T.astype(np.float64), atol=1e-4)
    assert np.all(np.diff(rotated.var(axis=0)) <= 1e-6)


def test_ivfpq_shortlist_reranked_at_full_size_and_its_cost_counts_every_scanned_code():
    pytest.importorskip("faiss")
    from eigtrain.evaluate.funnels import build_ivfpq, ivfpq_funnel_search

    x, q, w = _data("signed", seed=6, n=300, d=8)
    index = PrefixIndex(x, w)
    pq, cost = build_ivfpq(index, 4, nlist=2, nprobe=2), Cost()
    found = ivfpq_funnel_search(index, pq, q, [(8, 10)], cost, shortlist_size=300)  # every vector reranked
    assert recall_at(found, exact_top(index, q)) == 1.0
    assert pq.list_sizes.sum() == 300 and pq.subquantizers == 2
    assert cost.macs / cost.queries == 2 * 4 + 256 * 4 + 4 + 300 * 2 + 300 * 8 + 8


def test_eval_reports_retrieval_funnels_on_stored_features_when_asked(tmp_path, capsys):
    """Issue 55: the funnel rows were in report.json only; they are printed, in table.md and table.csv (a block of
    their own) and plotted (retrieval_funnels.png)."""
    import json

    import torch

    from eigtrain.evaluate.command import main as eval_main
    from eigtrain.export.files import save_export
    from eigtrain.export.moments import RRAccumulator
    from eigtrain.export.rayleigh_ritz import solve
    from tests.support.finite_kernels import blobs

    x, y = blobs(d=8)
    acc = RRAccumulator(8)
    acc.update(x[:400], x[:400] + 0.3 * torch.randn(400, 8, generator=torch.Generator().manual_seed(2)))
    save_export(solve(acc), tmp_path / "rr", {"kind": "test"}, plot=False)
    split = {"train_z": x[:400], "train_y": y[:400], "test_z": x[400:], "test_y": y[400:]}
    np.savez(tmp_path / "f.npz", **{k: v.numpy() for k, v in split.items()})
    args = [f"features={tmp_path / 'f.npz'}", f"rr={tmp_path / 'rr'}", "probe=closed_form", "random_draws=2"]
    assert eval_main([*args, f"out={tmp_path / 'ev'}", "dims=[4,8]", "retrieval=none", "retrieval_funnels=true"]) == 0
    rows = {
        r["method"]: r for r in json.loads((tmp_path / "ev" / "report.json").read_text())["retrieval_funnels"]["rows"]
    }
    assert rows["fixed k=8"]["recall@10"] == 1.0 and rows["bound early stop"]["recall@10"] == 1.0
    assert rows["fixed k=4"]["macs_per_query"] == 400 * 4 + 4
    printed = capsys.readouterr().out
    for text in (printed, (tmp_path / "ev" / "table.md").read_text()):
        assert "### Retrieval funnels: recall@10" in text and "| bound early stop | 1.000 |" in text
        assert "| fixed k=4 | " in text and "| 1,604 | 6,400 | – |" in text
    csv_rows = (tmp_path / "ev" / "table.csv").read_text().splitlines()
    at = csv_rows.index("retrieval funnel,recall@10,multiply-adds/query,bytes/query,mean stop k")
    assert csv_rows[at - 1] == "" and any(r.startswith("bound early stop,1.0000,") for r in csv_rows[at:])
    assert (tmp_path / "ev" / "retrieval_funnels.png").stat().st_size > 0 and "retrieval_funnels.png" in printed
    assert eval_main([*args, f"out={tmp_path / 'ev2'}", "dims=[4,8]", "retrieval=none"]) == 0
    assert "retrieval_funnels" not in json.loads((tmp_path / "ev2" / "report.json").read_text())
    assert "funnel" not in (tmp_path / "ev2" / "table.csv").read_text()
    assert not (tmp_path / "ev2" / "retrieval_funnels.png").exists()


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_funnels", REPO / "tools" / "bench_funnels.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_funnels_writes_every_row_family_and_its_exact_rows_recall_everything(tmp_path, capsys):
    """Every family on both corpora; on the mixed one (a rotated, anisotropic basis) PCA's prefixes are not the
    eigenbasis prefixes, and they find more at small k."""
    import json

    pytest.importorskip("faiss")
    bench = _bench()
    results = bench.main(["--n", "600", "--dim", "20", "--queries", "20", "--out", str(tmp_path)])
    assert json.loads(capsys.readouterr().out) == results
    assert json.loads((tmp_path / "funnels.json").read_text()) == results
    assert results["commands"] == ["python tools/bench_funnels.py --n 600 --dim 20 --queries 20 --out " + str(tmp_path)]
    for corpus in ("synthetic", "mixed"):
        for ref in ("s", "ip"):
            rows = {r["method"].split(" (")[0]: r for r in results["corpora"][corpus][ref]}
            assert rows["fixed k=20"]["recall@10"] == 1.0 and rows["bound early stop"]["recall@10"] == 1.0
            assert {bench._family(m) for m in rows} == {"fixed", "MRL", "spectrum", "bound", "PCA", "IVF-PQ"}
    mixed = {r["method"]: r["recall@10"] for r in results["corpora"]["mixed"]["ip"]}
    assert mixed["PCA fixed k=8"] > mixed["fixed k=8"] + 0.15
    assert (tmp_path / "funnels.md").read_text() == bench.markdown(results)
    assert (tmp_path / "funnels.png").stat().st_size > 0


def test_the_committed_funnels_table_is_the_json_it_was_made_from():
    """benchmarks/funnels.md is benchmarks/funnels.json rendered by tools/bench_funnels.py, made at a commit of this
    repository, with the digits rows from a run the JSON says how to make."""
    import json
    import subprocess

    results = json.loads((REPO / "benchmarks" / "funnels.json").read_text())
    assert set(results["corpora"]) == {"synthetic", "mixed", "digits"}
    assert any(c.startswith("OMP_NUM_THREADS=1 eigtrain-train experiment=quickstart") for c in results["commands"])
    committed = subprocess.run(["git", "cat-file", "-e", f"{results['commit']}^{{commit}}"], cwd=REPO)
    assert committed.returncode == 0, f"benchmarks/funnels.json names commit {results['commit']}, not in this repo"
    assert (REPO / "benchmarks" / "funnels.md").read_text() == _bench().markdown(results)


def test_funnel_plans_have_no_redundant_stages():
    """Issue 55: a stage scoring at no more coordinates than the one before reranks by the same prefix: merged
    (the smaller shortlist kept); plans the spectrum chooses carry no such stage and none is given twice."""
    from eigtrain.evaluate.funnels import TOP, plain_stages, spectrum_funnels

    assert plain_stages([(16, 200), (16, 50), (64, TOP)]) == [(16, 50), (64, TOP)]
    assert plain_stages([(64, 200), (64, TOP)]) == [(64, TOP)]  # a shortlist at full size is the full search
    assert plain_stages([(8, 200), (32, 50), (64, TOP)]) == [(8, 200), (32, 50), (64, TOP)]
    steep = np.r_[np.ones(4), np.full(60, 1e-9)]  # every cut of the spectrum at k = 4: k1 = k2
    plans = spectrum_funnels(steep, np.ones(64))
    for stages in plans.values():
        assert all(a[0] < b[0] for a, b in zip(stages, stages[1:])), plans
    assert len({tuple(s) for s in plans.values()}) == len(plans)
    flat = np.linspace(1, 0.5, 64)
    assert list(spectrum_funnels(flat, np.ones(64))) == ["spectrum 200@52 -> 64", "spectrum 200@52 -> 50@63 -> 64"]
