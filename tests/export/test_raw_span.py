"""The paper's convention from the export's centered solve (eigtrain.export.raw_span): the same eigenvalues and
features as Rayleigh-Ritz on the raw moments, without a second eigendecomposition."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.raw_span import paper_convention, paper_from_export, restricted_eigh
from eigtrain.export.rayleigh_ritz import solve


def _paper(centered, acc, rtol):
    """The paper convention through the shortcut: its eigenvalues at once, its features from the export's tensors."""
    derived = paper_convention(centered, acc, center=False, ridge=0.0, rtol=rtol)
    assert derived is not None
    values, transform = paper_from_export(centered.eigenvalues, centered.transform, centered.mean)
    assert torch.equal(values, derived.eigenvalues)
    return SimpleNamespace(eigenvalues=values, transform=transform)


def _pairs(d: int, n: int, offset: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(2, 0.2, d, dtype=torch.float64)
    shift = offset * torch.linspace(-1, 2, d, dtype=torch.float64)
    z1, z2 = (shared + 0.8 * torch.randn(n, d, generator=g, dtype=torch.float64) + shift for _ in range(2))
    acc = RRAccumulator(d)
    acc.update(z1, z2)
    return acc


@pytest.mark.parametrize("offset", [0.0, 0.3, 5.0])
def test_paper_convention_is_the_raw_solve(offset):
    acc = _pairs(40, 3000, offset)
    centered = solve(acc, trivial="exclude")
    raw = solve(acc, trivial="keep")  # the paper's convention from the raw moments
    fast = _paper(centered, acc, 1e-10)
    np.testing.assert_allclose(fast.eigenvalues.numpy(), raw.eigenvalues.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fast.transform.numpy(), raw.transform.numpy(), atol=1e-9)
    assert not raw.mean.any()


def test_a_centered_embedding_deflates_to_the_centered_features():
    acc = _pairs(12, 500, 0.0)
    acc.mean_f, acc.mean_g = torch.zeros(12, dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
    centered = solve(acc, trivial="exclude")
    fast = _paper(centered, acc, 1e-10)  # every pole but the constant's deflated: the raw span is the centered one
    np.testing.assert_allclose(fast.eigenvalues.numpy(), centered.eigenvalues.numpy(), rtol=1e-12)
    np.testing.assert_allclose(fast.transform.numpy(), centered.transform.numpy(), atol=1e-12)


def test_no_shortcut_where_the_raw_solve_could_differ():
    acc = _pairs(10, 400, 1.0)
    centered = solve(acc, trivial="exclude")
    assert paper_convention(centered, acc, center=False, ridge=0.1, rtol=1e-10) is None  # ridged: another problem
    assert paper_convention(centered, acc, center=True, ridge=0.0, rtol=1e-10) is None
    assert paper_convention(solve(acc, "paper-rq"), acc, center=False, ridge=0.0, rtol=1e-10) is None
    z1 = torch.randn(400, 10, dtype=torch.float64)
    z2 = z1 + 0.1 * torch.randn(400, 10, dtype=torch.float64)
    z1[:, 3] = z2[:, 3] = 2.0  # a dead coordinate: the centered solve drops it, the raw span holds the constant
    dead = RRAccumulator(10)
    dead.update(z1, z2)
    assert paper_convention(solve(dead, trivial="exclude"), dead, center=False, ridge=0.0, rtol=1e-10) is None


def test_restricted_eigh_matches_a_dense_eigendecomposition_on_clustered_poles():
    rng = np.random.default_rng(1)
    poles = np.concatenate([[1.0], 0.5 + 1e-9 * rng.standard_normal(50), rng.uniform(0, 1, 50)])
    u = rng.standard_normal(len(poles))
    u[7] = 1e-17  # deflated
    values, vectors = restricted_eigh(poles, u)
    basis = np.linalg.svd(np.eye(len(u)) - np.outer(u, u) / (u @ u))[0][:, : len(u) - 1]  # u's complement
    dense = np.linalg.eigvalsh(basis.T @ np.diag(poles) @ basis)
    np.testing.assert_allclose(values, dense, atol=1e-13)
    np.testing.assert_allclose(vectors.T @ vectors, np.eye(len(values)), atol=1e-12)  # orthonormal
    np.testing.assert_allclose(vectors.T @ u, 0, atol=1e-12)  # inside the complement
    residual = np.diag(poles) @ vectors - vectors * values - np.outer(u, u @ np.diag(poles) @ vectors) / (u @ u)
    assert np.abs(residual).max() < 1e-12  # P D y = lambda y


def _mixed_pairs(d: int, n: int, mix_condition: float, seed: int = 0):
    """tools/bench_rr_scale.py's model (views sharing a spectrum), mixed by a map of the given condition number."""
    rng = np.random.default_rng(seed)
    lam = np.linspace(0.95, 0.05, d)
    q1, _ = np.linalg.qr(rng.standard_normal((d, d)))
    q2, _ = np.linalg.qr(rng.standard_normal((d, d)))
    mix = (q1 * np.geomspace(1, 1 / mix_condition, d)) @ q2
    shared = rng.standard_normal((n, d))
    views = [(np.sqrt(lam) * shared + np.sqrt(1 - lam) * rng.standard_normal((n, d))) @ mix.T + 0.5 for _ in "ab"]
    acc = RRAccumulator(d)
    acc.update(*(torch.from_numpy(v) for v in views))
    return acc


def test_an_ill_conditioned_basis_still_takes_the_shortcut_and_agrees():
    """A mixing of condition 1e4 (the Gram's 1e8, as the benchmark's random mixing at d = 8,192): the Frobenius
    bound failed there and a second full solve ran; the Lanczos estimates keep the shortcut, exactly."""
    acc = _mixed_pairs(60, 4000, 1e4)
    centered = solve(acc, trivial="exclude")
    fast = _paper(centered, acc, 60 * 2.2e-16)
    raw = solve(acc, trivial="keep", rtol=60 * 2.2e-16)
    np.testing.assert_allclose(fast.eigenvalues.numpy(), raw.eigenvalues.numpy(), rtol=1e-8, atol=1e-10)
    predicted = raw.apply(torch.eye(60, dtype=torch.float64))  # the same features: transforms agree
    np.testing.assert_allclose(fast.transform.numpy(), predicted.numpy(), atol=1e-6 * float(predicted.abs().max()))


def test_the_shortcut_is_refused_where_the_raw_gram_nears_the_range_cut():
    acc = _mixed_pairs(30, 3000, 1e4)
    centered = solve(acc, trivial="exclude", rtol=1e-14)
    assert paper_convention(centered, acc, center=False, ridge=0.0, rtol=1e-14) is not None
    # rtol = 1e-8 * a little: the raw Gram's smallest eigenvalue (~1e-8 of the largest) is not 16 times above the cut
    assert paper_convention(centered, acc, center=False, ridge=0.0, rtol=1e-9) is None


def test_the_whitener_decides_on_converged_ends_of_the_spectrum():
    """The top eigenvector orthogonal to the ones vector (power iteration from it would not see it): the decision
    follows the true condition on both sides of WHITENER_MARGIN."""
    from eigtrain.export.whitening import WHITENER_MARGIN, cholesky_whitener, extreme_eigenvalue

    d = 50
    q, _ = np.linalg.qr(np.random.default_rng(2).standard_normal((d, d - 1)))
    basis = np.linalg.qr(np.column_stack([np.ones(d), q]))[0]  # column 0 along ones, the rest orthogonal to it
    for ratio, expected in ((2.0, True), (0.5, False)):
        values = np.geomspace(1.0, 1e-2, d)  # descending
        values[-1] = ratio * WHITENER_MARGIN * 1e-9 * 100.0  # the smallest against 1e-9 * the largest (100)
        values[0], values[1] = 1.0, 100.0  # ones-aligned column 0 gets 1; the largest lies orthogonal to ones
        gram = torch.from_numpy((basis * values) @ basis.T)
        assert extreme_eigenvalue(lambda x: gram @ x, d, gram.device) == pytest.approx(100.0, rel=1e-6)
        assert (cholesky_whitener(gram, 0.0, 1e-9, 10_000) is not None) is expected


def test_the_raw_solves_rank_is_read_off_the_centered_solves_ends(monkeypatch):
    """Where the means are moderate the centered solve's own Lanczos ends decide (no product with the raw Gram);
    a coordinate whose mean is 100 times its spread loosens that bound 1e4-fold, and the raw solve's own whitener
    test decides (the raw Gram itself stays well conditioned: the mean's rank-one part restores that direction)."""
    import eigtrain.export.raw_span as raw_span

    acc = _mixed_pairs(40, 3000, 1e2)
    centered = solve(acc, trivial="exclude")
    assert "gram_ends" in centered.extra
    calls = []
    real = raw_span.cholesky_whitener
    monkeypatch.setattr(raw_span, "cholesky_whitener", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert raw_span.raw_solve_full_rank(acc, centered, rtol=1e-8) and calls == []
    far = _mixed_pairs(40, 3000, 1e2)
    shift = torch.zeros(40, dtype=torch.float64)
    shift[7] = 100 * float(far.view_moments(True)[0][7, 7]) ** 0.5
    far.mean_f, far.mean_g = far.mean_f + shift, far.mean_g + shift  # the same centered moments, one mean far out
    centered = solve(far, trivial="exclude")
    assert raw_span.raw_solve_full_rank(far, centered, rtol=1e-8) and len(calls) == 1  # the raw whitener's test
    raw = solve(far, trivial="keep", rtol=1e-8)
    assert raw.transform.shape == (40, 40)  # the raw solve keeps every dimension indeed
