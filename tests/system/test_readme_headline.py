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
    at k = 4 Rayleigh-Ritz is about 1 point ahead of PCA and 2 ahead of joint nesting, at 16 half a point behind
    both; SCL's spectrum is flat."""
    monkeypatch.chdir(ROOT)
    claims = _claims_table()
    reports = claims.load()["scl"].values()

    def mean(method, k="4"):
        return 100 * sum(r["accuracy"][method][k] for r, _ in reports) / len(reports)

    readme = (ROOT / "README.md").read_text()
    assert "4 arbitrary coordinates lose about 35–40 points" in readme
    assert 35 <= min(mean("RR"), mean("JN")) - mean("RS") <= 40
    assert "At k = 4 Rayleigh–Ritz is about 1 point ahead of PCA\nand 2 ahead of joint nesting" in readme
    assert 0.5 <= mean("RR") - mean("PCA") <= 1.5 and 1.5 <= mean("RR") - mean("JN") <= 2.5
    assert "from 1.7 points behind PCA to 1.2 ahead" in readme and round(mean("RR") - mean("PCA"), 1) == 1.2
    assert "at k = 16 it is half a point\nbehind both" in readme
    assert all(0.2 <= mean(m, "16") - mean("RR", "16") <= 0.8 for m in ("PCA", "JN"))
    assert "λ₁₆/λ₁ ≈ 0.78" in readme
    assert all(0.76 <= claims.spectrum(e)[15] / claims.spectrum(e)[0] <= 0.80 for _, e in reports)


def test_quickstart_rr_at_4_is_within_a_point_of_pca_on_every_seed(monkeypatch):
    """Issue 22's bar, on the quickstart's recipe at its own 300 steps (3 seeds, the claims benchmark's reports): RR's
    first 4 features within 1 point of PCA's first 4, or better, on every seed (README: "within a point of PCA or
    better on every seed"). Before eigtrain-rr ordered the groups its halves do not order by variance, seed 2 was
    3.1 points behind (80.2 vs 83.3)."""
    monkeypatch.chdir(ROOT)
    reports = _claims_table().load()["scl"]
    assert sorted(reports) == [0, 1, 2]
    for seed, (report, _) in reports.items():
        rr, pca = (100 * report["accuracy"][m]["4"] for m in ("RR", "PCA"))
        assert rr >= pca - 1, (seed, rr, pca)
        assert report["constant_share"]["RR"][0] < 0.2, seed  # feature 1 is no constant: |mean| / sd < 0.5
    assert "within a point of PCA or better on every seed" in (ROOT / "README.md").read_text()


def test_readme_prefix_agreement_is_what_the_benchmark_measured():
    """README: on 3 quickstart runs the top 5 features agree across halves of the data to 0.97-0.98, the top 4 only
    to 0.74-0.87 (benchmarks/rr_prefixes.json, written by tools/bench_rr_prefixes.py)."""
    runs = json.loads((ROOT / "benchmarks" / "rr_prefixes.json").read_text())["runs"]
    top5, top4 = ([r["agreement"][k] for r in runs] for k in ("5", "4"))
    assert len(runs) == 3 and "the top 5 to 0.97–0.98, the top 4 only to 0.74–0.87" in (ROOT / "README.md").read_text()
    assert (round(min(top5), 2), round(max(top5), 2), round(min(top4), 2), round(max(top4), 2)) == (
        0.97,
        0.98,
        0.74,
        0.87,
    )
    assert max(top4) < min(top5)  # the cut at 4 is the less determined one on every run
