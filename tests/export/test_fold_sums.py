"""The per-fold accumulation's fast path against the straightforward float64 computation on the same rows: rows
read in their stored dtype (float32), strided folds, pieces of a fold, the per-cut test's moments projected from
the rows' sums without converting any fold (eigtrain.export.fold_sums, eigtrain.export.prefixes.cut_errors)."""

import json

import numpy as np
import pytest
import scipy.linalg
import torch
from safetensors.torch import load_file

import eigtrain.export.fold_sums as fold_sums
from eigtrain.export.command import main as rr_main
from eigtrain.export.moments import RRAccumulator
from eigtrain.export.prefixes import cut_errors
from eigtrain.export.rayleigh_ritz import solve

FOLDS = 4


def _pairs(n=2003, d=7, seed=0):
    """float32 pairs with a mean far from 0 and well separated correlations (no near-tie: the errors are stable)."""
    rng = np.random.default_rng(seed)
    rho = np.linspace(0.9, 0.1, d)
    latent = rng.normal(size=(n, d))
    other = rho * latent + np.sqrt(1 - rho**2) * rng.normal(size=(n, d))
    mix = rng.normal(size=(d, d)) + 2 * np.eye(d)
    return (latent @ mix + 5.0).astype(np.float32), (other @ mix + 5.0).astype(np.float32)


def _straight(z1, z2, centre=None):
    """(n, Gram over both views, symmetrized cross moment) of the rows in float64, about their pooled mean or `centre`."""
    f, g = z1.astype(np.float64), z2.astype(np.float64)
    c = (f.mean(0) + g.mean(0)) / 2 if centre is None else centre
    f, g = f - c, g - c
    n = len(f)
    return n, (f.T @ f + g.T @ g) / (2 * n), (f.T @ g + g.T @ f) / (2 * n)


def _accumulate(z1, z2, folds, batches=(1500, 200, 303)):
    """The rows in batches of different sizes (each batch's first row in another fold)."""
    acc, start = RRAccumulator(z1.shape[1], folds=FOLDS), 0
    for size in batches:
        rows = slice(start, start + size)
        acc.update(torch.from_numpy(z1[rows]), torch.from_numpy(z2[rows]), fold=torch.from_numpy(folds[rows]))
        start += size
    return acc


def _straight_cut_errors(z1, z2, folds, t, lam, centre):
    """rr_prefixes.cut_errors' statistic from each fold's moments computed directly from its rows."""
    m, n = len(lam) - 1, len(z1)
    moments = [_straight(z1[folds == i], z2[folds == i], centre) for i in range(FOLDS)]
    projected = [(t[:, :m].T @ gram @ t, t[:, :m].T @ cross @ t, k) for k, gram, cross in moments]
    whole_gram, whole_cross = (sum(p[j] * p[2] / n for p in projected) for j in (0, 1))
    gap = lam[None, :] - lam[:m, None]
    np.fill_diagonal(gap, 1.0)
    inside = lam[:m, None]  # the first-order coefficient c_ji = (dK_ji - lambda_i dG_ji) / (lambda_i - lambda_j)
    squared = sum(
        (((cross - whole_cross) - inside * (gram - whole_gram)) / gap) ** 2 * k / (n * (FOLDS - 1))
        for gram, cross, k in projected
    )
    np.fill_diagonal(squared, 0.0)
    return np.array([squared[:k, k:].sum() for k in range(1, m + 1)])


@pytest.mark.parametrize("by", ["row", "hash"])
def test_folds_the_whole_and_the_cut_errors_equal_the_straightforward_computation(monkeypatch, by):
    monkeypatch.setattr(fold_sums, "PIECE_ELEMENTS", 1)  # pieces of 256 rows: a fold of the first batch in two
    z1, z2 = _pairs()
    rng = np.random.default_rng(1)
    folds = np.arange(len(z1)) % FOLDS if by == "row" else rng.integers(0, FOLDS, len(z1))
    acc = _accumulate(z1, z2, folds)

    assert acc.fold_sizes == [int((folds == i).sum()) for i in range(FOLDS)]
    n, gram, cross = _straight(z1, z2)
    got_gram, got_cross = acc.view_moments(center=True)
    np.testing.assert_allclose(got_gram.numpy(), gram, rtol=1e-11, atol=1e-11 * np.abs(gram).max())
    np.testing.assert_allclose(got_cross.numpy(), cross, rtol=1e-11, atol=1e-11 * np.abs(cross).max())

    result = solve(acc)
    t, lam, centre = result.transform, result.eigenvalues, result.mean
    assert acc.pending_leaks(t, 3, centre, lam[:3]) is not None  # the folds were never converted: the fast path
    fast = cut_errors(result, acc)
    expected = _straight_cut_errors(z1, z2, folds, t.numpy(), lam.numpy(), centre.numpy())
    np.testing.assert_allclose(fast.numpy(), expected, rtol=1e-8)

    for i, fold in enumerate(acc.folds):  # converted now: each fold's own moments, and the test read from them
        k, gram, cross = _straight(z1[folds == i], z2[folds == i])
        assert fold.n == k
        np.testing.assert_allclose(fold.view_moments(center=True)[0].numpy(), gram, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(fold.view_moments(center=True)[1].numpy(), cross, rtol=1e-11, atol=1e-11)
    assert acc.pending_leaks(t, 3, centre, lam[:3]) is None
    np.testing.assert_allclose(cut_errors(result, acc).numpy(), expected, rtol=1e-8)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_rows_are_refused_before_any_fold_changes(value):
    z1, z2 = _pairs(n=1200)
    folds = np.arange(len(z1)) % FOLDS
    acc = _accumulate(z1[:600], z2[:600], folds[:600], batches=(600,))
    before = acc.fold_sizes, acc.view_moments(center=True)
    bad = z2[600:].copy()
    bad[-1, 3] = value  # the batch's last row: its fold comes after others were already read
    with pytest.raises(ValueError, match="non-finite"):
        acc.update(torch.from_numpy(z1[600:]), torch.from_numpy(bad), fold=torch.from_numpy(folds[600:]))
    assert acc.fold_sizes == before[0]
    for got, then in zip(acc.view_moments(center=True), before[1]):
        torch.testing.assert_close(got, then, rtol=0, atol=0)


def test_float32_files_export_the_float64_solve(tmp_path):
    """eigtrain-rr on float32 .npy files (read as stored, memory-mapped) equals scipy's generalized eigh of the
    float64 moments, and its cut errors equal the straightforward ones (embedding files: folds in contiguous blocks)."""
    z1, z2 = _pairs(n=3001, d=6)
    (tmp_path / "emb").mkdir()
    np.save(tmp_path / "emb" / "z1.npy", z1)
    np.save(tmp_path / "emb" / "z2.npy", z2)
    assert rr_main([f"embeddings={tmp_path / 'emb'}", f"out={tmp_path / 'rr'}", f"folds={FOLDS}"]) == 0
    tensors = load_file(str(tmp_path / "rr" / "rr.safetensors"))
    _, gram, cross = _straight(z1, z2)
    lam, vecs = scipy.linalg.eigh(cross, gram)
    lam, vecs = lam[::-1], vecs[:, ::-1]
    np.testing.assert_allclose(tensors["eigenvalues"].numpy(), lam, rtol=1e-10, atol=1e-12)
    signs = np.sign((tensors["transform"].numpy() * vecs).sum(0))
    np.testing.assert_allclose(tensors["transform"].numpy() * signs, vecs, atol=1e-9)
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    expected = _straight_cut_errors(
        z1, z2, np.arange(len(z1)) * FOLDS // len(z1), tensors["transform"].numpy(), lam, tensors["mean"].numpy()
    )
    np.testing.assert_allclose(manifest["cuts"]["error"], expected, rtol=1e-5, atol=1e-6)  # the manifest rounds
