"""Shrinkage of the Gram before Rayleigh-Ritz whitens by it (eigtrain-rr's default, `shrinkage=oas`).

The generalized problem divides by the Gram: a direction's eigenvalue is its cross moment over its variance.
From n samples in p dimensions the sample Gram's small eigenvalues come out too small and noisy, which
inflates the quotients of the weakest directions; the standard remedy in regularized CCA (which Rayleigh-Ritz
on two views is, with tied weights) is to shrink the covariance of both views toward a multiple of the
identity. The intensity is the Oracle Approximating Shrinkage of Chen, Wiesel, Eldar & Hero (IEEE TSP 2010,
eq. 23, as scikit-learn's `OAS` computes it), which needs only n and the Gram's spectrum: the joint covariance
of the two views shrunk, G -> (1 - rho) G + rho mu I and K -> (1 - rho) K (mu the mean eigenvalue), i.e.
K y = lambda (G + rho / (1 - rho) mu I) y (features orthonormal under the shrunk Gram). Eigenvalues never exceed
the unshrunk quotients; rho ~ p / n, so it fades as the data grow. n counts samples, not views (an image's two
views are far from independent).
Measured on the quickstart: docs/export.md, "Shrinkage".
"""

from __future__ import annotations

import torch

SHRINKAGE = ("oas", "none")


def oas_intensity(evals: torch.Tensor, n: int) -> float:
    """The OAS intensity rho in [0, 1] for a sample covariance with eigenvalues `evals` from n samples."""
    p = len(evals)
    t1, t2 = float(evals.sum()), float((evals**2).sum())
    spread = t2 - t1**2 / p  # 0 when every eigenvalue is equal: nothing to shrink toward
    if p < 2 or spread <= 1e-12 * t2:
        return 0.0
    return min(1.0, (t2 + t1**2) / ((n + 1) * spread))


def shrink(evals: torch.Tensor, n: int, method: str) -> tuple[torch.Tensor, float]:
    """(the shrunk Gram's eigenvalues, same eigenvectors: (1 - rho) evals + rho mu; the intensity rho, which also
    scales the cross moment by 1 - rho); `none`: unchanged, 0. rho = 1 (a sample too small to tell the Gram from
    a multiple of the identity) leaves every eigenvalue 0: the features then carry no order."""
    if method not in SHRINKAGE:
        raise ValueError(f"shrinkage={method!r} is unknown; allowed: {', '.join(SHRINKAGE)}")
    if method == "none":
        return evals, 0.0
    rho = oas_intensity(evals, n)
    return (1 - rho) * evals + rho * evals.mean(), rho
