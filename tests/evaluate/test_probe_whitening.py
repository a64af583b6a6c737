"""The probes score a span, not its basis: each method's first k features are whitened on the training split before
a probe, so an invertible linear map of the input leaves its accuracy unchanged, a rank-deficient prefix scores as
its span does, and at k = d every method of eigtrain-eval's report (the same space) scores the same."""

import json

import pytest
import torch

from eigtrain.evaluate.command import main as eval_main
from eigtrain.evaluate.probes import pca_features, probe_accuracy, probe_correct, whiten
from eigtrain.evaluate.table import adaptive_dimension_table
from eigtrain.export.command import main as rr_main
from tests.support.finite_kernels import blobs
from tests.support.runs import overrides

PROBES = ("sgd", "closed_form")


def _orthogonal(d: int, gen: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]


def _ill_conditioned(d: int, condition: float, seed: int) -> torch.Tensor:
    """A random invertible d x d map whose singular values run from 1 to 1 / condition."""
    gen = torch.Generator().manual_seed(seed)
    singular = torch.logspace(0, -torch.log10(torch.tensor(condition)).item(), d, dtype=torch.float64)
    return _orthogonal(d, gen) @ torch.diag(singular) @ _orthogonal(d, gen).T


def _split(x, y, n_train):
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


@pytest.mark.parametrize("probe", PROBES)
def test_an_invertible_map_of_the_input_leaves_the_probe_unchanged(probe):
    x, y = blobs()
    mapped = (x.double() @ _ill_conditioned(16, 1e4, seed=3)).float()
    first, second = (probe_correct(*_split(z, y, 400), probe=probe)[0] for z in (x, mapped))
    assert (first != second).sum() <= 1  # the same test samples, to float32 rounding
    assert first.mean() > 0.9
    # the two stacked as independent problems give the same rows (each whitened by its own covariance)
    pair = [torch.stack([x[part], mapped[part]]) for part in (slice(0, 400), slice(400, None))]
    stacked = probe_correct(pair[0], y[:400], pair[1], y[400:], probe=probe)
    assert (stacked[0] != first).sum() <= 1 and (stacked[1] != second).sum() <= 1
    # per-feature standardization, the former protocol, did depend on the basis
    old = (probe_correct(*_split(z, y, 400), probe=probe, whitened=False)[0] for z in (x, mapped))
    assert (next(old) != next(old)).sum() > 10


def test_a_rank_deficient_prefix_is_whitened_on_its_numerical_range():
    """Columns that repeat others (in another combination) and a constant column add no direction: whitening keeps
    the 8 the input spans (unit covariance, no inf or nan), and the probes score it as the 8 columns alone."""
    x, y = blobs()
    base = x[:, :8]
    mixed = base[:, :4] @ torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
    padded = torch.cat([base, mixed, torch.full((len(x), 1), 3.0)], 1)  # 14 columns, rank 8
    train, test = whiten(padded[:400], padded[400:])
    assert torch.isfinite(train).all() and torch.isfinite(test).all() and train.shape == (400, 14)
    kept = train.norm(dim=0) > 0
    assert kept.sum() == 8
    torch.testing.assert_close(train[:, kept].T.double().cov(), torch.eye(8, dtype=torch.float64), atol=1e-4, rtol=0)
    for probe in PROBES:
        alone, padded_hits = (probe_correct(*_split(z, y, 400), probe=probe)[0] for z in (base, padded))
        assert (alone != padded_hits).sum() <= 1


def test_correlated_coordinates_of_a_separated_problem_score_as_their_span():
    """The old failure: classes that a linear probe separates, embedded by correlated coordinates whose class
    directions have small variance. Standardized per feature, the raw coordinates scored far below their own
    principal components (the same space); whitened, both score what the space allows."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (800,), generator=gen)
    latent = torch.randn(800, 16, generator=gen, dtype=torch.float64)
    latent[:, :4] += 4.0 * torch.nn.functional.one_hot(y, 4)
    scales = torch.ones(16, dtype=torch.float64)
    scales[:4] = 1e-2  # the class directions: 1 % of the spread of the others, mixed into every coordinate
    raw = (latent * scales @ _orthogonal(16, gen).T).float()
    components = torch.cat(pca_features(raw[:600], raw[600:]))  # the same span in uncorrelated coordinates
    bases = {"raw": raw, "pca": components}
    for probe in PROBES:
        score = lambda z, w: probe_accuracy(*_split(z, y, 600), probe=probe, whitened=w).item()  # noqa: E731
        whitened = {name: score(z, True) for name, z in bases.items()}
        standardized = {name: score(z, False) for name, z in bases.items()}
        assert whitened["raw"] > 0.95 and abs(whitened["raw"] - whitened["pca"]) <= 1 / 200
        assert standardized["pca"] > 0.95 and standardized["raw"] < standardized["pca"] - 0.01
        if probe == "sgd":
            assert standardized["raw"] < 0.5  # SGD on the ill-conditioned coordinates barely leaves chance


@pytest.mark.parametrize("whitened", [True, False])
def test_the_table_scores_every_basis_of_the_full_space_alike(whitened):
    """adaptive_dimension_table on ordered features and a badly conditioned basis of the same space: at k = d, RR,
    PCA and RS score the same only when the probes whiten (the report says which protocol ran)."""
    x, y = blobs()
    raw = (x.double() @ _ill_conditioned(16, 1e3, seed=5)).float()
    report = adaptive_dimension_table(
        {"rr": x[:400], "raw": raw[:400]},
        {"rr": x[400:], "raw": raw[400:]},
        y[:400],
        y[400:],
        dims=[4, 16],
        random_draws=2,
        probe="closed_form",
        retrieval_backend=None,
        whitened=whitened,
    )
    full = [row[16] for row in report["accuracy"].values()]
    assert report["probe_features"] == ("whitened" if whitened else "standardized")
    assert (max(full) - min(full) < 1e-6) == whitened, report["accuracy"]


@pytest.mark.slow
def test_at_full_dimension_every_method_of_the_report_scores_the_same(digits_root, tmp_path):
    """A small joint-nesting run reduced by eigtrain-rr and evaluated by eigtrain-eval: RR, RR (paper), JN, PCA and RS
    at k = d are the same space (RS: all d coordinates in a random order), so every probe scores them the same, on
    the same test samples; below d they are different subspaces and score differently."""
    from eigtrain.train.command import compose_config, run

    run_dir = tmp_path / "run"
    run(compose_config(overrides(run_dir, digits_root, "steps=4", "nesting=joint", "checkpoint_every=4")))
    assert rr_main([f"run_dir={run_dir}", "batch_size=128", "num_workers=0"]) == 0
    for probe, dims in (("closed_form", "[4,16]"), ("sgd", "[16]")):  # the SGD probe at k = d only: seconds
        out = tmp_path / f"eval_{probe}"
        args = [
            f"run_dir={run_dir}",
            f"out={out}",
            f"probe={probe}",
            f"dims={dims}",
            "random_draws=2",
            "retrieval=none",
        ]
        assert eval_main(args) == 0
        report = json.loads((out / "report.json").read_text())
        accuracy = report["accuracy"]
        assert set(accuracy) == {"RR", "RR (paper)", "JN", "PCA", "RS"} and report["probe_features"] == "whitened"
        full = [row["16"] for row in accuracy.values()]
        assert max(full) - min(full) < 1e-6, accuracy
        assert all(cell["16"]["first_only"] == cell["16"]["second_only"] == 0 for cell in report["paired"].values())
        if probe == "closed_form":  # below d they are different subspaces, and the probe tells them apart
            assert len({round(row["4"], 6) for row in accuracy.values()}) > 1
