"""Embeddings whose Rayleigh-Ritz eigenpairs are known exactly (issue 33's ground truth).

Two views of n samples: u_v = sqrt(lambda) * s + sqrt(1 - lambda) * e_v with s, e_1, e_2 standard normal, so in
the latent basis the Gram is I and the cross moment diag(lambda): latent coordinate i is eigenfunction i with
eigenvalue lambda_i. The embedding is z_v = u_v @ M^T for an invertible M, which changes the basis and nothing else.
"""

from __future__ import annotations

import numpy as np

SPREAD = np.linspace(0.95, 0.10, 16)  # 16 eigenvalues, gaps of 0.057


def latent_pairs(eigenvalues: np.ndarray, n: int, seed: int):
    """(u1, u2), each (n, d): the latent views, eigenfunction i = column i."""
    rng = np.random.default_rng(seed)
    lam = np.asarray(eigenvalues, dtype=np.float64)
    shared = rng.standard_normal((n, len(lam)))
    views = [np.sqrt(lam) * shared + np.sqrt(1 - lam) * rng.standard_normal((n, len(lam))) for _ in range(2)]
    return views[0], views[1]


def mixing(case: str, d: int, seed: int) -> np.ndarray:
    """The basis z = u @ M^T of each case: whitened (M = I), anisotropic (a few directions hold most of the
    variance, in a random basis), against (variance rising as the eigenvalue falls: the top eigenfunctions are the
    quietest coordinates)."""
    rng = np.random.default_rng(seed + 1000)
    if case == "whitened":
        return np.eye(d)
    if case == "anisotropic":
        left, _ = np.linalg.qr(rng.standard_normal((d, d)))
        right, _ = np.linalg.qr(rng.standard_normal((d, d)))
        scales = np.where(np.arange(d) < 3, 100.0, 1.0) * np.linspace(1, 0.5, d)
        return left @ np.diag(scales) @ right.T
    if case == "against":
        return np.diag(np.logspace(-1, 2, d))
    raise ValueError(case)


def write_case(path, case: str, eigenvalues=SPREAD, n: int = 20000, seed: int = 0):
    """Write z1, z2 of one case to path (npz); returns the latent views (the truth) and M."""
    u1, u2 = latent_pairs(eigenvalues, n, seed)
    m = mixing(case, len(eigenvalues), seed)
    np.savez(path, z1=u1 @ m.T, z2=u2 @ m.T)
    return u1, u2, m


def feature_correlations(features: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|corr(feature i, true eigenfunction i)| for each i (signs are arbitrary)."""
    f = features - features.mean(0)
    t = truth[:, : f.shape[1]] - truth[:, : f.shape[1]].mean(0)
    return np.abs((f * t).sum(0) / np.sqrt((f * f).sum(0) * (t * t).sum(0)))
