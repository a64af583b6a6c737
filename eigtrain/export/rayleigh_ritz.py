"""Rayleigh-Ritz: order any embedding's span into eigenfunctions with eigenvalues (docs/export.md).

Stream positive pairs (z1, z2) once into an RRAccumulator (float64 means and centered co-moments,
merged exactly with Chan's parallel update across batches, workers and ranks), then `solve`:

- generalized (default): K y = lambda G y with G = E[f f^T] (both views), K = sym E[f g^T]. Exact
  whenever the span is right, whatever the basis.
- paper-rq / paper-vicreg / paper-lora: the paper's appendix-F algorithms, for reproduction.
- svd: two encoders; whiten each side by its own Gram and take the SVD of the whitened cross moment.

The trivial mode (README, "Rayleigh-Ritz"): the constant function is an eigenfunction of every pair kernel
(eigenvalue / singular value 1) and every other one is orthogonal to it under the data distribution. With
trivial="exclude" (default) the constant is put in the span and RR is solved on its complement (the moments
centered: pooled mean for one encoder, one mean per side for pairs); the constant is returned separately
(`RRResult.trivial`: eigenvalue 1 and its least-squares read-out from z) and the ordered features follow it.
trivial="keep" is the paper's convention: RR on the raw span, where a span holding the constant (LoRA/SCL)
returns it as feature 1. center=True (and paper-vicreg, which is centered by definition) removes the
constant without exporting it. A centered embedding (RQ/VICReg) loses nothing either way.

Rank-deficient embeddings (dead units, duplicated or dependent dimensions, d above the rank) are solved on
the Gram's numerical range (eigenvalues above rtol * the largest); `RRResult.dims` says how many coordinates
were dead (no variance over the data), dependent, or spent on the constant. ridge > 0 instead regularizes the
Gram and keeps every dimension (an explicit departure from the exact solve: docs/export.md). A sample that cannot
order the span (no more pairs than the Gram's rank) is refused, never solved into an arbitrary order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eigtrain.export.moments import RRAccumulator, t_matmul
from eigtrain.export.rr_config import MODES, TRIVIAL  # noqa: F401  (the configuration's names)
from eigtrain.export.whitening import (
    cho_solve,
    cholesky,
    cholesky_whitener,
    descending_eigh,
    ridged,
    whitened_eigh,
)

IN_SPAN_TOL = 1e-6  # mean-square residual below which the span counts as holding the constant
F64 = torch.float64


def centered(mode: str, center: bool, trivial: str) -> bool:
    """Whether a solve works on centered moments: asked for, the trivial mode excluded (Rayleigh-Ritz on the
    constant's complement), or the paper's VICReg algorithm (centered by definition, Welford)."""
    return center or trivial == "exclude" or mode == "paper-vicreg"


@dataclass
class RRResult:
    """Ordered features: feature i of z is ((z - mean) @ transform)[:, i], eigenvalues descending (`solve`;
    eigtrain-rr ties=variance may then reorder the undetermined groups by variance, rr_prefixes.order_ties)."""

    eigenvalues: torch.Tensor
    transform: torch.Tensor
    mean: torch.Tensor
    mode: str
    n: int
    right_transform: torch.Tensor | None = None
    right_mean: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)
    trivial: dict | None = None  # the constant mode when excluded: eigenvalue, transform (z @ t ~ 1), residual
    dims: dict = field(default_factory=dict)  # dim, dead, dependent, constant, features (and "right" for svd)

    def apply(self, z: torch.Tensor, k: int | None = None) -> torch.Tensor:
        return (z.to(F64) - self.mean.to(z.device)) @ self.transform[:, :k].to(z.device)

    def apply_right(self, z: torch.Tensor, k: int | None = None) -> torch.Tensor:
        if self.right_transform is None:
            raise ValueError(f"mode {self.mode!r} has no right-side transform (only 'svd' does)")
        assert self.right_mean is not None  # set with the right transform
        return (z.to(F64) - self.right_mean.to(z.device)) @ self.right_transform[:, :k].to(z.device)


def _range(gram: torch.Tensor, ridge: float, rtol: float, what: str, n: int | None = None):
    """Eigenpairs of the (ridged) Gram on its numerical range: eigenvalues > rtol * the largest, descending.
    n: the number of pairs; a range as wide as the sample (rank >= n) is refused: n pairs cannot order it."""
    evals, evecs = descending_eigh(ridged(gram, ridge))
    if not evals[0] > 0:
        raise ValueError(f"Rayleigh-Ritz: every dimension of {what} is constant over the data (nothing to order)")
    keep = evals > rtol * evals[0]
    if n is not None and int(keep.sum()) >= n:
        raise ValueError(
            f"Rayleigh-Ritz: {n} pairs cannot order {what}'s {int(keep.sum())} live dimensions (the Gram's rank is "
            f"limited by the sample, so any order would be the sample's): give more pairs than dimensions"
        )
    return evals[keep], evecs[:, keep]


def _rank(gram: torch.Tensor, ridge: float, rtol: float, range_evals: torch.Tensor) -> int:
    """The unregularized Gram's numerical rank: the range's size when no ridge was added (no second eigh)."""
    if ridge == 0:
        return len(range_evals)
    evals = torch.linalg.eigvalsh((gram + gram.T) / 2)
    return int((evals > rtol * evals[-1]).sum()) if evals[-1] > 0 else 0


def fix_signs(*transforms: torch.Tensor) -> None:
    """Deterministic signs: the largest-magnitude entry of each column of the first transform is > 0."""
    first = transforms[0]
    idx = first.abs().argmax(0)
    signs = torch.sign(first[idx, torch.arange(first.shape[1])])
    signs[signs == 0] = 1
    for t in transforms:
        t.mul_(signs)


def constant_readout(
    raw_gram: torch.Tensor, mean: torch.Tensor, rtol: float, live=None, full_rank: bool = False, centered_factor=None
):
    """(w, residual): the least-squares w with z @ w ~ 1 under the data (w = G^+ E[z] on G's numerical range,
    over the `live` coordinates only when given) and E[(1 - z @ w)^2] = 1 - E[z]^T w (0: the span holds 1).
    full_rank: the centered Gram has no null direction, so the raw one (it plus the mean's outer product) is
    positive definite: a Cholesky solve instead of an eigendecomposition (a sixth of the cost).
    centered_factor: the centered Gram's Cholesky factor, already computed (the solve's whitener): with
    x = G_c^-1 m, Sherman-Morrison gives w = (G_c + m m^T)^-1 m = x / (1 + m^T x) and the residual 1 / (1 + m^T x),
    O(d^2) where a factorization of the raw Gram costs d^3 / 3."""
    live = torch.ones_like(mean, dtype=torch.bool) if live is None else live
    w = torch.zeros_like(mean)
    if centered_factor is not None and live.all():
        x = cho_solve(centered_factor, mean[:, None])[:, 0]
        spread = 1 + float(mean @ x)
        return x / spread, 1 / spread
    if full_rank and live.all():
        factor = cholesky(raw_gram)
        if factor is not None:
            w = cho_solve(factor, mean[:, None])[:, 0]
            return w, float((1 - mean @ w).clamp_min(0))
    if live.any():
        evals, evecs = _range(raw_gram[live][:, live], 0.0, rtol, "the embedding")
        w[live] = evecs @ ((evecs.T @ mean[live]) / evals)
    return w, float((1 - mean @ w).clamp_min(0))


def _dims_report(
    gram: torch.Tensor,
    raw_gram: torch.Tensor,
    mean: torch.Tensor,
    exclude: bool,
    rtol: float,
    features: int,
    rank: int,
    readout: tuple | None = None,
    dead: torch.Tensor | None = None,
) -> dict:
    """How the d coordinates were spent: dead (no variance over the data when the constant is excluded, no second
    moment otherwise), constant (1 when live coordinates span the excluded constant), dependent (the rest of
    the rank deficit of the unregularized Gram: `rank` is its numerical rank), features (ordered features exported).
    readout: `constant_readout` over every coordinate, already computed (reused when no coordinate is dead)."""
    diag = torch.diagonal(gram)
    if dead is None:  # (the svd mode's sides, and the paper's modes, which are basis-dependent by design)
        dead = diag <= rtol * diag.max().clamp_min(torch.finfo(F64).tiny)
    if exclude and not dead.all():
        residual = (
            readout[1] if readout is not None and not dead.any() else constant_readout(raw_gram, mean, rtol, ~dead)[1]
        )
    constant = int(exclude and not dead.all() and residual <= IN_SPAN_TOL)
    d = len(diag)
    return {
        "dim": d,
        "dead": int(dead.sum()),
        "constant": constant,
        "dependent": max(0, d - int(dead.sum()) - constant - rank),
        "features": features,
    }


def _solve_svd(acc, gff, ggg, kfg, mf, mg, raw_f, raw_g, ridge: float, rtol: float, exclude: bool) -> RRResult:
    """Two encoders: whiten each side by its own Gram (on its range), then the SVD of the whitened cross moment."""
    (sf, uf), (sg, ug) = (
        _range(gff, ridge, rtol, "the x-side embedding", acc.n),
        _range(ggg, ridge, rtol, "the a-side embedding", acc.n),
    )
    wf, wg = uf * sf.rsqrt(), ug * sg.rsqrt()
    u, s, vh = torch.linalg.svd(wf.T @ kfg @ wg)
    k = min(wf.shape[1], wg.shape[1])
    values, transform, right = s[:k], wf @ u[:, :k], wg @ vh[:k].T
    fix_signs(transform, right)
    result = RRResult(values, transform, mf, "svd", acc.n, right, mg)
    result.dims = {
        **_dims_report(gff, raw_f, acc.mean_f, exclude, rtol, k, _rank(gff, ridge, rtol, sf)),
        "right": _dims_report(ggg, raw_g, acc.mean_g, exclude, rtol, k, _rank(ggg, ridge, rtol, sg)),
    }
    if exclude:
        (w, res), (wr, res_r) = (
            constant_readout(raw_f, acc.mean_f, rtol),
            constant_readout(raw_g, acc.mean_g, rtol),
        )
        result.trivial = {
            "eigenvalue": 1.0,
            "transform": w,
            "residual": res,
            "right_transform": wr,
            "right_residual": res_r,
        }
    return result


def _check_solve(acc: RRAccumulator, mode: str, trivial: str) -> None:
    if mode not in MODES:
        raise ValueError(f"rr mode={mode!r} is unknown; allowed: {', '.join(MODES)}")
    if trivial not in TRIVIAL:
        raise ValueError(f"rr trivial={trivial!r} is unknown; allowed: {', '.join(TRIVIAL)}")
    if (mode == "svd") != acc.pairs:
        raise ValueError(
            f"rr mode={mode!r} does not fit this data: use 'svd' for two encoders (pairs) and one of "
            f"{', '.join(m for m in MODES if m != 'svd')} for one encoder on two views"
        )


def solve(
    acc: RRAccumulator,
    mode: str = "generalized",
    center: bool = False,
    ridge: float = 0.0,
    rtol: float | None = None,
    trivial: str = "exclude",
) -> RRResult:
    """Solve the Rayleigh-Ritz problem from accumulated moments (see the module docstring); rtol: the range cut
    (None: `default_rtol`)."""
    rtol = default_rtol(acc, mode) if rtol is None else rtol
    _check_solve(acc, mode, trivial)
    exclude = trivial == "exclude"
    center = centered(mode, center, trivial)
    if mode == "svd":
        gff, ggg, kfg, mf, mg = acc.second_moments(center)
        raw_f, raw_g, _, _, _ = acc.second_moments(False)
        return _solve_svd(acc, gff, ggg, kfg, mf, mg, raw_f, raw_g, ridge, rtol, exclude)

    gram, cross = acc.view_moments(center)
    pooled = (acc.mean_f + acc.mean_g) / 2  # one encoder: both views share one mean
    mf = pooled if center else torch.zeros_like(pooled)
    # the raw Gram over both views: the centered one plus the pooled mean's outer product (no second pass over the sums)
    raw = gram.clone().addr_(pooled, pooled) if center else gram
    dead = None
    if mode == "generalized" and ridge == 0:  # the exact solve on unit-variance coordinates: no cut depends on scales
        dead, scale = _equilibrator(gram, raw, rtol)
        same = raw is gram  # view_moments' tensors are this call's own: scaled in place (3 d x d copies spared)
        gram, cross = (m.mul_(scale[:, None]).mul_(scale[None, :]) for m in (gram, cross))
        raw = gram if same else raw.mul_(scale[:, None]).mul_(scale[None, :])
        pooled_scaled = pooled * scale
    else:
        scale, pooled_scaled = None, pooled
    ends = cholesky_whitener(gram, ridge, rtol, acc.n) if mode == "generalized" else None
    whitener = None if ends is None else ends.factor
    if whitener is None:
        evals, evecs = _range(gram, ridge, rtol, "the embedding", acc.n)
    extra: dict = {}
    if ends is not None and scale is not None:  # raw_span reads the raw solve's rank off them
        extra["gram_ends"] = {"smallest": ends.smallest, "largest": ends.largest, "scale": scale}
    if mode == "generalized" and whitener is not None:  # the exact solve, the Gram of full rank: W = L^-T
        values, transform = whitened_eigh(cross, whitener)
        evals = torch.ones(len(gram), dtype=F64)  # only its size is used below
    elif mode == "generalized":  # the exact solve: whiten by the Gram on its range, then K's eigenbasis there
        w = evecs * evals.rsqrt()
        values, y = descending_eigh(t_matmul(w, t_matmul(cross, w)))  # w^T K w (K symmetric), numpy's BLAS
        transform = t_matmul(w.T, y)
    elif mode in ("paper-rq", "paper-vicreg"):  # Algorithms F.1 / F.2: the basis is taken as orthonormal
        values, y = descending_eigh(evecs.T @ cross @ evecs)  # (on the range: null directions are zero features)
        transform = evecs @ y
    else:  # paper-lora, Algorithm F.3: LoRA features are Q sqrt(Sigma) psi*, so the Gram's spectrum
        values, transform = evals, evecs * evals.rsqrt()  # the ridge enters Sigma^{-1/2} as in the other modes
    full_rank = ridge == 0 and len(evals) == len(gram) and (dead is None or not dead.any())
    factor = whitener if center and ridge == 0 else None  # of the centered Gram: raw = centered + pooled pooled^T
    readout = constant_readout(raw, pooled_scaled, rtol, None, full_rank, factor) if exclude else None
    rank = _rank(gram, ridge, rtol, evals)
    dims = _dims_report(gram, raw, pooled_scaled, exclude, rtol, transform.shape[1], rank, readout, dead)
    if scale is not None:  # back to the embedding's own coordinates
        transform = scale[:, None] * transform
        readout = None if readout is None else (scale * readout[0], readout[1])
    fix_signs(transform)
    result = RRResult(values, transform, mf, mode, acc.n, extra=extra)
    result.dims = dims
    if readout is not None:  # the constant excluded: its read-out
        result.trivial = {"eigenvalue": 1.0, "transform": readout[0], "residual": readout[1]}
    return result


LEGACY_RTOL = 1e-10  # the range cut of the basis-dependent modes (paper-*, svd): relative to the largest eigenvalue


def default_rtol(acc: RRAccumulator, mode: str = "generalized") -> float:
    """The generalized solve's range cut from its input's precision: an equilibrated direction within 4 input epsilons
    of the largest (sd ratio) is rounding, and none finer than the float64 Gram (d * 2.2e-16); else `LEGACY_RTOL`."""
    if mode != "generalized" or acc.input_eps <= 0:
        return LEGACY_RTOL
    return max((4 * acc.input_eps) ** 2, acc.dim * torch.finfo(F64).eps)


def _equilibrator(gram: torch.Tensor, raw: torch.Tensor, rtol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(dead, scale): the coordinates with no variation of their own (variance at most rtol times their own second
    moment: a rule no rescaling of a coordinate changes), and 1 / standard deviation of the others (0 for the
    dead). Jacobi equilibration: the solve then sees every live coordinate at unit variance, so its range cut acts
    on the span's conditioning, not on the coordinates' scales (x1e6 on one coordinate moves nothing)."""
    diag, second = torch.diagonal(gram), torch.diagonal(raw)
    dead = ~(diag > rtol * second) | ~(diag > torch.finfo(F64).tiny)
    scale = torch.where(dead, 0.0, diag.clamp_min(torch.finfo(F64).tiny).rsqrt())
    return dead, scale
