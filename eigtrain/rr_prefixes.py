"""What the prefixes of a Rayleigh-Ritz export are worth: the k its spectrum suggests (`spectral_k_report`), and how
far each prefix is determined by the data (`prefix_reproducibility`: the same solve on two disjoint halves of the
rows, `RRAccumulator(halves=True)`, top-k subspaces compared; docs/export.md, "Which prefixes are determined").

Measured on the quickstart (SCL, digits, 3 seeds; tools/bench_rr_prefixes.py): the top five eigenvalues lay within
0.995-0.986; the top-5 subspace agreed across halves to 0.97-0.98, the top 4 only to 0.74-0.87 and the top 1 to
0.43-0.78: which 4 of those 5 come first follows the sample, which is why Rayleigh-Ritz at k = 4 varied by
several points between augmentation draws while k = 5 and 8 did not.
"""

from __future__ import annotations

import torch

from .rayleigh_ritz import RRAccumulator, solve


def _g_orthonormal(u: torch.Tensor, gram: torch.Tensor) -> torch.Tensor:
    """u's columns re-expressed as an orthonormal basis of their span in the metric of `gram`."""
    w, v = torch.linalg.eigh(u.T @ gram @ u)
    return u @ v @ torch.diag(w.clamp_min(torch.finfo(w.dtype).tiny).rsqrt()) @ v.T


def prefix_reproducibility(
    acc: RRAccumulator,
    dims: list[int],
    mode: str = "generalized",
    center: bool = False,
    ridge: float = 0.0,
    rtol: float = 1e-10,
    trivial: str = "exclude",
) -> dict[int, float] | None:
    """For each k in dims: how far the first k features are determined by the data. Rayleigh-Ritz is solved on
    each of the accumulator's two halves, and the top-k subspaces are compared in the data's metric (the Gram of
    the whole): the mean squared cosine of their principal angles, 1 when both halves choose the same k features,
    about k'/k when only k' of them are determined (a cut inside a group of near-equal eigenvalues: any k of the
    group serve the kernel equally, and which k come first follows the sample). None without halves or for svd."""
    if acc.halves is None or acc.pairs or min(h.n for h in acc.halves) < 2:
        return None
    kwargs = dict(center=center, ridge=ridge, rtol=rtol, trivial=trivial)
    first, second = (solve(h, mode, **kwargs) for h in acc.halves)
    gff, ggg, _, _, _ = acc.second_moments(center or trivial == "exclude" or mode == "paper-vicreg")
    gram = (gff + ggg) / 2
    width = min(first.transform.shape[1], second.transform.shape[1])
    out = {}
    for k in dims:
        if 1 <= k <= width:
            a, b = (_g_orthonormal(r.transform[:, :k], gram) for r in (first, second))
            out[k] = round(float((a.T @ gram @ b).pow(2).sum() / k), 4)
    return out


SPECTRAL_SHARES = (0.5, 0.9)


def spectral_k(eigenvalues: torch.Tensor, share: float, power: int = 1) -> int:
    """The smallest k whose first k eigenvalues (beyond the trivial mode; negative ones count 0) hold `share`
    of the sum of lambda**power."""
    mass = eigenvalues.double().clamp_min(0) ** power
    if not mass.sum() > 0:
        return len(mass)
    return int((torch.cumsum(mass, 0) < share * mass.sum() * (1 - 1e-12)).sum()) + 1


def spectral_k_report(eigenvalues: torch.Tensor) -> dict[str, int]:
    """{"sum_0.9": k, "sum_sq_0.9": k, ...}: spectral_k at each share of sum(lambda) and sum(lambda^2)."""
    return {
        f"{name}_{share:g}": spectral_k(eigenvalues, share, power)
        for share in SPECTRAL_SHARES
        for name, power in (("sum", 1), ("sum_sq", 2))
    }
