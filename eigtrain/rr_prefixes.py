"""What the prefixes of a Rayleigh-Ritz export are worth: the k its spectrum suggests (`spectral_k_report`), and how
far each prefix is determined by the data (`agreement_curve`: the same solve on two disjoint halves of the rows,
`RRAccumulator(halves=True)`, top-k subspaces compared; docs/export.md, "Which prefixes are determined"), and the
order inside the groups of features the halves do not order (`tie_groups`, `order_ties`: by the
embedding's variance).

Measured on the quickstart (SCL, digits, 3 seeds, eigtrain-rr's defaults; tools/bench_rr_prefixes.py): the top five
eigenvalues lay within 0.995-0.983; the top-5 subspace agreed across halves to 0.93-1.00, the top 4 only to
0.76-0.97 and the top 1 to 0.46-0.81: which 4 of those 5 come first follows the sample, which is why
Rayleigh-Ritz at k = 4 in eigenvalue order varied by several points between augmentation draws while k = 8 did
not; ordered by variance inside such groups it was within a point of PCA or better in 14 of 15 exports (84.7 vs
84.4 % on the mean; 9 of 15 in eigenvalue order alone; benchmarks/claims.md).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .rayleigh_ritz import RRAccumulator, RRResult, centered, fix_signs, solve


def agreement_curve(
    acc: RRAccumulator,
    mode: str = "generalized",
    center: bool = False,
    ridge: float = 0.0,
    rtol: float = 1e-10,
    trivial: str = "exclude",
    shrinkage: str = "none",
) -> torch.Tensor | None:
    """How far each prefix is determined by the data: entry k-1 for the first k features. Rayleigh-Ritz is solved
    on each of the accumulator's two halves and their top-k subspaces are compared in the data's metric (the Gram of
    the whole): the mean squared cosine of their principal angles, 1 when both halves choose the same k features,
    about k'/k when only k' of them are determined (a cut inside a group of near-equal eigenvalues: any k of the
    group serve the kernel equally, and which k come first follows the sample). None without halves or for svd.
    Every k at once: a QR of each half's whitened transform spans every prefix (O(d^3) in all)."""
    if acc.halves is None or acc.pairs or min(h.n for h in acc.halves) < 2:
        return None
    kwargs = dict(center=center, ridge=ridge, rtol=rtol, trivial=trivial, shrinkage=shrinkage)
    first, second = (solve(h, mode, **kwargs) for h in acc.halves)
    gram, _ = acc.view_moments(centered(mode, center, trivial))
    evals, evecs = torch.linalg.eigh(gram)
    root = (evecs * evals.clamp_min(0).sqrt()).T  # root.T @ root = the Gram: the data's metric made Euclidean
    width = min(first.transform.shape[1], second.transform.shape[1])
    qa, qb = (torch.linalg.qr(root @ r.transform[:, :width]).Q for r in (first, second))
    overlap = (qa.T @ qb).pow(2).cumsum(0).cumsum(1)
    k = torch.arange(1, width + 1, dtype=overlap.dtype)
    return torch.diagonal(overlap) / k


def prefix_reproducibility(curve: torch.Tensor | None, dims: list[int]) -> dict[int, float] | None:
    """`agreement_curve` at the sizes in dims (the manifest's `reproducibility`)."""
    if curve is None:
        return None
    return {k: round(float(curve[k - 1]), 4) for k in dims if 1 <= k <= len(curve)}


def tie_groups(curve: torch.Tensor, below: float) -> list[list[int]]:
    """Runs of features (first, last; 1-based) that no determined cut separates: a cut after feature k is
    determined when the halves agree on the first k features to at least `below`."""
    cuts = [0, *(k for k in range(1, len(curve)) if curve[k - 1] >= below), len(curve)]
    return [[a + 1, b] for a, b in zip(cuts, cuts[1:]) if b - a > 1]


def order_ties(result: RRResult, acc: RRAccumulator, groups: list[list[int]], center: bool) -> RRResult:
    """Within each group the halves do not order, the eigenvalues give no reliable order (where they are nearly
    equal, any basis of the group's span is an eigenbasis to within what the data determine): order it by the
    share of the embedding's variance each feature explains, i.e. the embedding's principal components within the
    group. A feature psi = (z - m) @ t with E[psi^2] = 1 explains ||E[(z - m) psi]||^2 = ||G t||^2 of it (G the
    second moment the solve used; for a PCA component, its variance). Eigenvalues become each new feature's
    Rayleigh quotient (under the Gram the solve used, shrunk or not); their sum per group, and every prefix that
    ends at a group's edge, are unchanged. center: the
    moments the solve used were centered (`centered`)."""
    gram, cross = acc.view_moments(center)
    transform, values = result.transform.clone(), result.eigenvalues.clone()
    kept = 1 - (result.extra.get("shrinkage") or {}).get("intensity", 0.0)  # the solve's factor on the cross moment
    for first, last in groups:
        part = transform[:, first - 1 : last]
        explained = gram @ part
        _, rotation = torch.linalg.eigh(explained.T @ explained)
        part = part @ rotation.flip(1)
        fix_signs(part)
        transform[:, first - 1 : last] = part
        values[first - 1 : last] = kept * torch.einsum("di,de,ei->i", part, cross, part)
    return replace(result, transform=transform, eigenvalues=values, extra=dict(result.extra))


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
