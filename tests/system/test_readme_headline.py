"""README's headline table is generated from the stored claims reports (benchmarks/claims/*/report.json) by
tools/claims_table.py; this fails when the README no longer says what those reports hold."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _claims_table():
    spec = importlib.util.spec_from_file_location("claims_table", ROOT / "tools" / "claims_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_headline_is_the_claims_table(monkeypatch):
    monkeypatch.chdir(ROOT)  # the tool reads benchmarks/claims relative to the repository root
    claims = _claims_table()
    expected = "\n".join(claims.headline(claims.load()))
    assert expected in (ROOT / "README.md").read_text(), (
        "README's headline table is stale: run python tools/claims_table.py"
    )


def test_readme_prose_beside_the_table_says_what_the_reports_hold(monkeypatch):
    """The sentences under the table: 4 random coordinates lose about 35-40 points against the first 4 ordered ones;
    at k = 4 RR, JN and PCA are level on the mean; at 8 RR leads both, at 16 it lies between them; SCL's spectrum
    is flat on the sample moments and not with the Gram's shrinkage."""
    monkeypatch.chdir(ROOT)
    claims = _claims_table()
    reports = claims.load()["scl"].values()

    def mean(method, k="4"):
        return 100 * sum(r["accuracy"][method][k] for r, _ in reports) / len(reports)

    readme = (ROOT / "README.md").read_text()
    assert "4 arbitrary coordinates lose about 35–40 points" in readme
    assert 35 <= min(mean("RR"), mean("JN")) - mean("RS") <= 40
    assert "At k = 4 Rayleigh–Ritz, joint nesting and PCA\nare level on the mean" in readme
    assert max(mean(m) for m in ("RR", "JN", "PCA")) - min(mean(m) for m in ("RR", "JN", "PCA")) <= 0.5
    assert "At k = 8 RR leads PCA and joint nesting; at k = 16 it lies between them" in readme
    assert mean("RR", "8") > max(mean("PCA", "8"), mean("JN", "8"))
    assert min(mean("PCA", "16"), mean("JN", "16")) < mean("RR", "16") < max(mean("PCA", "16"), mean("JN", "16"))
    assert "(λ₁₆/λ₁ ≈ 0.78; 0.21–0.23 with the shrinkage)" in readme  # the sample moments as they are / OAS
    unshrunk = [claims.spectrum(e, "eigenvalues, shrinkage=none") for _, e in reports]
    assert all(0.76 <= lam[15] / lam[0] <= 0.80 for lam in unshrunk)
    assert {round(claims.spectrum(e)[15] / claims.spectrum(e)[0], 2) for _, e in reports} <= {0.21, 0.22, 0.23}


def test_quickstart_rr_at_4_against_pca_on_every_seed(monkeypatch):
    """Issue 22's bar, on the quickstart's own defaults at its 300 steps (the claims benchmark's 3 seeds; seed 0 is
    the quickstart command's run): RR's first 4 features within 1 point of PCA's first 4, or better, on every seed
    (it failed on seed 0 on the sample moments as they are, as README says); feature 1 is no constant on any."""
    monkeypatch.chdir(ROOT)
    reports = _claims_table().load()["scl"]
    assert sorted(reports) == [0, 1, 2]
    gaps, unshrunk = {}, {}
    for seed, (report, _) in reports.items():
        accuracy = report["accuracy"]
        gaps[seed] = round(100 * (accuracy["RR"]["4"] - accuracy["PCA"]["4"]), 1)
        unshrunk[seed] = round(100 * (accuracy["RR, shrinkage=none"]["4"] - accuracy["PCA"]["4"]), 1)
        assert report["constant_share"]["RR"][0] < 0.2, seed  # feature 1 is no constant: |mean| / sd < 0.5
    assert min(gaps.values()) >= -1  # the bar
    assert gaps == {0: -0.8, 1: 0.6, 2: -0.8} and unshrunk[0] == -1.7
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "RR is **within a point of PCA or better on every seed** (−0.8, +0.6 and −0.8 points; seed 0 is" in readme
    assert "the quickstart command's run had RR 1.7 points behind PCA at k = 4" in readme


def test_readme_prefix_agreement_is_what_the_benchmark_measured():
    """README: on the 3 quickstart runs the top 5 features agree across halves of the data to 0.93-1.00, the top 4
    only to 0.76-0.97 (benchmarks/rr_prefixes.json, written by tools/bench_rr_prefixes.py); without the Gram's
    shrinkage the top 16 agreed only to 0.84-0.86 (0.94-0.97 with it)."""
    runs = json.loads((ROOT / "benchmarks" / "rr_prefixes.json").read_text())["runs"]

    def spread(key, k):
        values = [r[key][k] for r in runs]
        return round(min(values), 2), round(max(values), 2)

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert len(runs) == 3 and "the top 5 to 0.93–1.00, the top 4 only to 0.76–0.97" in readme
    assert (spread("agreement", "5"), spread("agreement", "4")) == ((0.93, 1.0), (0.76, 0.97))
    assert "the top 16 to 0.94–0.97 instead of 0.84–0.86" in readme
    assert (spread("agreement", "16"), spread("agreement, shrinkage=none", "16")) == ((0.94, 0.97), (0.84, 0.86))
    assert all(0.004 < r["shrinkage"]["intensity"] < 0.006 for r in runs)


def test_readme_shrinkage_and_tie_ordering_effects_are_what_the_draws_measured():
    """README: over 5 augmentation draws of eigtrain-rr on each of the 3 quickstart runs, RR at k = 4 was within a
    point of PCA or better in 14 of the 15 exports (11 without the Gram's shrinkage, 9 in eigenvalue order alone),
    84.7 % on the mean (PCA 84.4)."""
    bench = json.loads((ROOT / "benchmarks" / "rr_prefixes.json").read_text())
    runs = bench["runs"]
    assert bench["draws"] == 5 and len(runs) == 3

    def mean(name, i):
        return sum(row[i] for r in runs for row in r["by_draw"][name]) / 15

    def within(name):
        return sum(row[0] >= r["by_draw"]["PCA"][0] - 1 for r in runs for row in r["by_draw"][name])

    pca = sum(r["by_draw"]["PCA"][0] for r in runs) / 3
    assert (within("RR"), within("RR, shrinkage=none"), within("RR, tie_agreement=0")) == (14, 11, 9)
    assert (round(mean("RR", 0), 1), round(pca, 1)) == (84.7, 84.4)
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        "RR at k = 4 was within a point of PCA or better in 14 of the 15 exports (11 without the shrinkage, 9 in "
        "eigenvalue order alone), 84.7 % on the mean (PCA 84.4)" in readme
    )


def test_the_claims_scl_runs_are_the_quickstart_commands_runs(monkeypatch, tmp_path):
    """README: the claims benchmark keeps the quickstart's own defaults, "so seed 0 is the quickstart command's run":
    its SCL training config is tools/quickstart.sh's (with STEPS=300) but for where it writes and how it logs, and
    its eigtrain-rr call adds nothing to the run directory."""
    from omegaconf import OmegaConf

    from eigtrain.train import compose_config

    spec = importlib.util.spec_from_file_location("bench_claims", ROOT / "tools" / "bench_claims.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = []
    monkeypatch.setattr(bench, "run", seen.append)
    bench.train(tmp_path / "main", 300, 0, "scl")
    quickstart = compose_config(["experiment=quickstart", "run_dir=X", "steps=300", "logging.wandb.mode=disabled"])
    mine, theirs = (OmegaConf.to_container(c, resolve=False) for c in (seen[0], quickstart))
    for cfg in (mine, theirs):  # where it writes, how often it checkpoints and whether it prints progress
        cfg.pop("run_dir"), cfg.pop("checkpoint_every"), cfg["logging"].pop("progress")
        cfg["data"]["root"] = str(Path(cfg["data"]["root"]))
    assert mine == theirs
    assert 'rr_main([f"run_dir={main}"])' in (ROOT / "tools" / "bench_claims.py").read_text()  # eigtrain-rr's defaults
    assert "seed 0 is the quickstart command's run" in (ROOT / "README.md").read_text()
