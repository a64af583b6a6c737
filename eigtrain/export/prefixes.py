"""What the prefixes of a Rayleigh-Ritz export are worth: the k its spectrum suggests (`spectral_k_report`), and at
which cuts the data determine the order (`cut_errors`, `undetermined_cuts`; docs/export.md, "Which cuts are
determined").

A cut after feature k is determined when the top-k subspace is: its error is driven by the gap lambda_k - lambda_k+1
against the sampling noise of the moments. `cut_errors` estimates, for every cut at once, the expected squared
error ||sin Theta||_F^2 of the exported top-k subspace, by first-order perturbation with noise measured across
folds of the rows: in the export's basis (Gram = I, cross moment = diag(lambda)) a fold's moments differ from the
whole's by dG, dK, and to first order the perturbed feature i gains the component
c_ji = (dK_ji - lambda_i dG_ji) / (lambda_i - lambda_j) along feature j (docs/export.md derives it);
sum_f n_f c_ji^2 / (n (F - 1)) estimates the whole's squared coefficient, and the error at cut k sums it over i <= k < j
(the components the top-k subspace gains outside itself). Per cut, never averaged over a prefix. The cuts after
features 1 .. 256 are tested (per fold two d x d x 256 products and one 256 x d x d, no eigendecomposition); any
later cut is reported as untested, never as determined.

The rule, undetermined at an estimated error >= 0.05 (about 13 degrees for one direction), was calibrated on
ground truth only (two-view Gaussians with known eigenvalues, tests/export/test_rr_ground_truth.py): at an exact
tie the estimate is >= 0.05 in about 9 of 10 samples (n = 2,000 and 20,000, 8 folds); at a gap of 2.5 noise
standard deviations in about 1 of 20, and at larger gaps never.

`order_ties` (opt-in, eigtrain-rr ties=variance) reorders each undetermined group by the embedding's variance: a
departure from Rayleigh-Ritz's order, for users who want PCA's order where the kernel's is not determined.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from eigtrain.export.moments import RRAccumulator, t_matmul
from eigtrain.export.rayleigh_ritz import RRResult, fix_signs

CUT_LIMIT = 256  # cuts tested: after features 1 .. 256 (the prefixes users cut at; bounds the cost at large d)
UNDETERMINED_AT = 0.05  # a cut's estimated ||sin Theta||_F^2 at or above it: the order there is not determined


def cut_errors(result: RRResult, acc: RRAccumulator) -> torch.Tensor | None:
    """Entry k-1: the estimated squared subspace error of the export's first k features, k = 1 .. min(r-1, 256) (see the
    module docstring). None without folds, for two encoders, or for a mode whose features are not the generalized
    solve's (their basis is not orthonormal under the Gram)."""
    sizes = acc.fold_sizes
    if sizes is None or acc.pairs or min(sizes) < 2 or result.mode != "generalized":
        return None
    t, lam = result.transform, result.eigenvalues
    m = min(len(lam) - 1, CUT_LIMIT)  # cuts after features 1..m: rows i <= m of the rotation, every column j
    if m < 1:
        return None
    gap = lam[None, :] - lam[:m, None]  # (i, j): lambda_j - lambda_i
    tiny = torch.finfo(t.dtype).eps * max(1.0, float(lam.abs().max()))
    gap = torch.where(gap.abs() < tiny, torch.full_like(gap, tiny), gap)  # an exact tie: no order at all
    # each fold's K - lambda_i G (row i: the feature whose leak into feature j, column j, is measured) about the
    # whole's centre (the solve's), in the export's basis: the whole's is their average weighted by the folds' sizes
    # (moments about one centre, linear in them), so a fold differs from the whole by noise only (from the rows'
    # sums when the folds were never converted: the same values, in a fraction of the d x d work)
    leaks = acc.pending_leaks(t, m, result.mean, lam[:m])
    if leaks is None:
        leaks = [_fold_leaks(fold, t, m, result.mean, lam[:m]) for fold in acc.folds or ()]
    whole = sum(leak * (size / acc.n) for leak, size in zip(leaks, sizes))
    squared = torch.zeros_like(gap)
    for leak, size in zip(leaks, sizes):
        coefficient = (leak - whole) / gap  # c_ji = (dK_ji - lambda_i dG_ji) / (lambda_j - lambda_i), up to its sign
        # sum_f n_f (M_f - M)^2 / (F - 1) estimates n Var(M): the whole's own squared error, per entry
        squared += coefficient.square() * (size / (acc.n * (len(sizes) - 1)))
    squared[torch.arange(m), torch.arange(m)] = 0
    # error at cut k: the sum over i <= k < j (rows above the cut, columns below it)
    above = squared.cumsum(0)  # above[k-1, j] = sum over i < k
    right = above.flip(1).cumsum(1).flip(1)  # right[k-1, k] = sum over i < k, j >= k
    k = torch.arange(1, m + 1)
    return right[k - 1, k]


def _fold_leaks(acc: RRAccumulator, t: torch.Tensor, m: int, centre: torch.Tensor, head_values: torch.Tensor):
    """t[:, :m]^T K t - diag(head_values) t[:, :m]^T G t: acc's symmetrized cross moment K and Gram G over both
    views about `centre`, in the basis t. The means' parts are rank one, projected as vectors: the d x d work is
    two sums and the products."""
    n, head = acc.n, t[:, :m]
    af, ag = acc.mean_f - centre, acc.mean_g - centre
    (hf, hg), (tf, tg) = ((x @ af, x @ ag) for x in (head.T, t.T))

    def project(sums: torch.Tensor) -> torch.Tensor:
        return t_matmul(t_matmul(head, sums).T, t) / (2 * n)  # (head^T sums) t through numpy's BLAS

    gram = project(acc.c_ff + acc.c_gg) + (torch.outer(hf, tf) + torch.outer(hg, tg)) / 2
    cross = project(acc.c_fg + acc.c_fg.T) + (torch.outer(hf, tg) + torch.outer(hg, tf)) / 2
    return cross - head_values.to(t.dtype)[:, None] * gram


def undetermined_cuts(errors: torch.Tensor | None) -> list[int]:
    """The k (1-based) whose cut after feature k the data do not determine."""
    return [] if errors is None else [k + 1 for k in range(len(errors)) if errors[k] >= UNDETERMINED_AT]


def cuts_report(errors: torch.Tensor | None, folds_n: list[int] | None, width: int) -> dict | None:
    """The manifest's `cuts`: the per-cut error estimates, the undetermined cuts, the rule, which cuts were tested
    (of the `width` features' width - 1)."""
    if errors is None:
        return None
    return {
        "error": [round(float(e), 6) for e in errors],
        "undetermined": undetermined_cuts(errors),
        "undetermined_at": UNDETERMINED_AT,
        "tested": len(errors),  # the cuts after features 1 .. tested; a later one was not tested (CUT_LIMIT)
        "features": width,
        "folds_n": folds_n,
    }


def tie_groups(undetermined: list[int], tested: int) -> list[list[int]]:
    """Runs of features (first, last; 1-based) that no determined cut separates, among features 1 .. tested + 1
    (cuts after features 1 .. tested were tested; features after them are in no group: their order is untested)."""
    width = tested + 1
    cuts = [0, *(k for k in range(1, width) if k not in set(undetermined)), width]
    return [[a + 1, b] for a, b in zip(cuts, cuts[1:]) if b - a > 1]


def order_ties(result: RRResult, acc: RRAccumulator, groups: list[list[int]], center: bool) -> RRResult:
    """Opt-in (ties=variance): order each group the data do not order by the share of the embedding's variance
    each feature explains, i.e. the embedding's principal components within the group. A feature
    psi = (z - m) @ t with E[psi^2] = 1 explains ||G t||^2 of it (G the Gram the solve used). Eigenvalues become
    each new feature's Rayleigh quotient; their sum per group, and every prefix that ends at a group's edge, are
    unchanged. center: the moments the solve used were centered."""
    gram, cross = acc.view_moments(center)
    transform, values = result.transform.clone(), result.eigenvalues.clone()
    for first, last in groups:
        part = transform[:, first - 1 : last]
        explained = gram @ part
        _, rotation = torch.linalg.eigh(explained.T @ explained)
        part = part @ rotation.flip(1)
        fix_signs(part)
        transform[:, first - 1 : last] = part
        values[first - 1 : last] = torch.einsum("di,de,ei->i", part, cross, part)
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
