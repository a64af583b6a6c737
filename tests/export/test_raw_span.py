"""The paper's convention from the export's centered solve (eigtrain.export.raw_span): the same eigenvalues and
features as Rayleigh-Ritz on the raw moments, without a second eigendecomposition."""

import numpy as np
import pytest
import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.raw_span import paper_convention, restricted_eigh
from eigtrain.export.rayleigh_ritz import solve


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
    fast = paper_convention(centered, acc, center=False, ridge=0.0, rtol=1e-10)
    assert fast is not None
    np.testing.assert_allclose(fast.eigenvalues.numpy(), raw.eigenvalues.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fast.transform.numpy(), raw.transform.numpy(), atol=1e-9)
    assert torch.equal(fast.mean, raw.mean) and fast.dims == raw.dims


def test_a_centered_embedding_deflates_to_the_centered_features():
    acc = _pairs(12, 500, 0.0)
    acc.mean_f, acc.mean_g = torch.zeros(12, dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
    centered = solve(acc, trivial="exclude")
    fast = paper_convention(centered, acc, center=False, ridge=0.0, rtol=1e-10)
    assert fast is not None  # every pole but the constant's deflated: the raw span is the centered one
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
