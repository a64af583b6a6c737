"""Rayleigh-Ritz: order any embedding's span into eigenfunctions with eigenvalues (DESIGN.md section 3).

Stream positive pairs (z1, z2) once into an RRAccumulator (float64 means and centered co-moments,
merged exactly with Chan's parallel update across batches, workers and ranks), then `solve`:

- generalized (default): K y = lambda G y with G = E[f f^T] (both views), K = sym E[f g^T]. Exact
  whenever the span is right, whatever the basis.
- paper-rq / paper-vicreg / paper-lora: the paper's appendix-F algorithms, for reproduction.
- svd: two encoders; whiten each side by its own Gram and take the SVD of the whitened cross moment.

center=True removes the constant mode (pooled mean for one encoder, one mean per side for pairs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MODES = ("generalized", "paper-rq", "paper-vicreg", "paper-lora", "svd")
F64 = torch.float64


class RRAccumulator:
    """Streaming float64 statistics of pairs: count, means, centered co-moment sums."""

    def __init__(self, dim: int, pairs: bool = False, dim_right: int | None = None, device="cpu"):
        if dim_right is not None and not pairs:
            raise ValueError("dim_right is only meaningful for pairs=True (two encoders)")
        self.dim, self.pairs = dim, pairs
        self.dim_right = dim_right or dim
        if not pairs and self.dim_right != dim:
            raise ValueError("one encoder on two views needs equal dimensions")
        d, e = self.dim, self.dim_right
        zeros = lambda *s: torch.zeros(*s, dtype=F64, device=device)  # noqa: E731
        self.n = 0
        self.mean_f, self.mean_g = zeros(d), zeros(e)
        self.c_ff, self.c_gg, self.c_fg = zeros(d, d), zeros(e, e), zeros(d, e)

    # -- accumulation ---------------------------------------------------------------------
    @torch.no_grad()
    def update(self, z1: torch.Tensor, z2: torch.Tensor) -> None:
        """Add a batch of pairs: z1 (first view or x side), z2 (second view or a side)."""
        if z1.ndim != 2 or z1.shape[1] != self.dim or z2.ndim != 2 or z2.shape[1] != self.dim_right:
            raise ValueError(
                f"expected z1 (batch, {self.dim}) and z2 (batch, {self.dim_right}), got "
                f"{tuple(z1.shape)} and {tuple(z2.shape)}"
            )
        if len(z1) != len(z2):
            raise ValueError(f"z1 and z2 must pair up row by row, got {len(z1)} and {len(z2)} rows")
        if len(z1) == 0:
            return
        f, g = z1.to(self.c_ff.device, F64), z2.to(self.c_ff.device, F64)
        if not (torch.isfinite(f).all() and torch.isfinite(g).all()):
            raise ValueError("non-finite values in the embeddings given to Rayleigh-Ritz")
        mf, mg = f.mean(0), g.mean(0)
        fc, gc = f - mf, g - mg
        self._merge(len(f), mf, mg, fc.T @ fc, gc.T @ gc, fc.T @ gc)

    def merge(self, other: "RRAccumulator") -> None:
        """Fold another accumulator in (exact: the same result as one pass over both streams)."""
        if (other.dim, other.dim_right, other.pairs) != (self.dim, self.dim_right, self.pairs):
            raise ValueError("cannot merge accumulators of different shapes or modes")
        dev = self.c_ff.device
        self._merge(other.n, *(t.to(dev) for t in (other.mean_f, other.mean_g, other.c_ff, other.c_gg, other.c_fg)))

    def _merge(self, nb, mf, mg, cff, cgg, cfg) -> None:
        na, n = self.n, self.n + nb
        if nb == 0:
            return
        df, dg = mf - self.mean_f, mg - self.mean_g
        w = na * nb / n
        self.c_ff += cff + w * torch.outer(df, df)
        self.c_gg += cgg + w * torch.outer(dg, dg)
        self.c_fg += cfg + w * torch.outer(df, dg)
        self.mean_f += df * (nb / n)
        self.mean_g += dg * (nb / n)
        self.n = n

    @torch.no_grad()
    def all_reduce(self, group=None) -> None:
        """Combine the accumulators of all ranks in place (two all-reduces of O(d^2))."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return
        # 1) global count and mean; 2) co-moments shifted to the global mean, summed.
        head = torch.cat([self.c_ff.new_tensor([float(self.n)]), self.n * self.mean_f, self.n * self.mean_g])
        dist.all_reduce(head, group=group)
        n = int(round(head[0].item()))
        mean_f, mean_g = head[1 : 1 + self.dim] / max(n, 1), head[1 + self.dim :] / max(n, 1)
        df, dg = self.mean_f - mean_f, self.mean_g - mean_g
        shifted = [
            self.c_ff + self.n * torch.outer(df, df),
            self.c_gg + self.n * torch.outer(dg, dg),
            self.c_fg + self.n * torch.outer(df, dg),
        ]
        flat = torch.cat([t.reshape(-1) for t in shifted])
        dist.all_reduce(flat, group=group)
        d, e = self.dim, self.dim_right
        self.c_ff, self.c_gg, self.c_fg = flat[: d * d].view(d, d), flat[d * d : d * d + e * e].view(e, e), flat[d * d + e * e :].view(d, e)
        self.n, self.mean_f, self.mean_g = n, mean_f, mean_g

    def state_dict(self) -> dict:
        return {"n": self.n, **{k: getattr(self, k).clone() for k in ("mean_f", "mean_g", "c_ff", "c_gg", "c_fg")}}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state["n"])
        for k in ("mean_f", "mean_g", "c_ff", "c_gg", "c_fg"):
            getattr(self, k).copy_(state[k])

    # -- moments --------------------------------------------------------------------------
    def second_moments(self, center: bool):
        """(E[f f^T], E[g g^T], E[f g^T], mean_f, mean_g), raw or centered, float64."""
        if self.n < 2:
            raise ValueError(f"Rayleigh-Ritz needs at least 2 pairs, got {self.n}")
        n = self.n
        if not self.pairs:  # one encoder: both views share one mean
            pooled = (self.mean_f + self.mean_g) / 2
            mf = mg = pooled if center else torch.zeros_like(pooled)
        else:
            mf = self.mean_f if center else torch.zeros_like(self.mean_f)
            mg = self.mean_g if center else torch.zeros_like(self.mean_g)
        af, ag = self.mean_f - mf, self.mean_g - mg  # offsets of the stored means from the centre
        gff = self.c_ff / n + torch.outer(af, af)
        ggg = self.c_gg / n + torch.outer(ag, ag)
        kfg = self.c_fg / n + torch.outer(af, ag)
        return gff, ggg, kfg, mf, mg


@dataclass
class RRResult:
    """Ordered features: feature i of z is ((z - mean) @ transform)[:, i], eigenvalues descending."""

    eigenvalues: torch.Tensor
    transform: torch.Tensor
    mean: torch.Tensor
    mode: str
    n: int
    right_transform: torch.Tensor | None = None
    right_mean: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)

    def apply(self, z: torch.Tensor, k: int | None = None) -> torch.Tensor:
        return (z.to(F64) - self.mean.to(z.device)) @ self.transform[:, :k].to(z.device)

    def apply_right(self, z: torch.Tensor, k: int | None = None) -> torch.Tensor:
        if self.right_transform is None:
            raise ValueError(f"mode {self.mode!r} has no right-side transform (only 'svd' does)")
        return (z.to(F64) - self.right_mean.to(z.device)) @ self.right_transform[:, :k].to(z.device)


def _ridged(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    """G + ridge * (mean eigenvalue of G) * I."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    if ridge == 0:
        return gram
    d = gram.shape[0]
    return gram + ridge * (torch.trace(gram) / d) * torch.eye(d, dtype=F64, device=gram.device)


def _check_conditioned(evals: torch.Tensor, rtol: float, what: str) -> None:
    """Raise the clear error (never NaNs) when ascending eigenvalues `evals` are singular/ill-conditioned."""
    top = evals[-1].clamp_min(0)
    if not top > 0 or evals[0] <= rtol * top:
        raise ValueError(
            f"Rayleigh-Ritz: the Gram matrix of {what} is singular or ill-conditioned "
            f"(smallest/largest eigenvalue = {(evals[0] / top).item() if top > 0 else float('nan'):.3g}, "
            f"rtol={rtol:g}): some embedding dimensions are dead or linear combinations of others. "
            f"Pass ridge=1e-6 (adds ridge * mean eigenvalue to the diagonal) or use fewer dimensions."
        )


def _inverse_sqrt(gram: torch.Tensor, ridge: float, rtol: float, what: str) -> torch.Tensor:
    """(G + ridge)^{-1/2} with a clear error (never NaNs) when it is singular or ill-conditioned."""
    evals, evecs = torch.linalg.eigh(_ridged(gram, ridge))
    _check_conditioned(evals, rtol, what)
    return evecs @ torch.diag(evals.rsqrt()) @ evecs.T


def _descending_eigh(sym: torch.Tensor):
    evals, evecs = torch.linalg.eigh((sym + sym.T) / 2)
    return evals.flip(0), evecs.flip(1)


def _fix_signs(*transforms: torch.Tensor) -> None:
    """Deterministic signs: the largest-magnitude entry of each column of the first transform is > 0."""
    first = transforms[0]
    idx = first.abs().argmax(0)
    signs = torch.sign(first[idx, torch.arange(first.shape[1])])
    signs[signs == 0] = 1
    for t in transforms:
        t.mul_(signs)


def solve(acc: RRAccumulator, mode: str = "generalized", center: bool = False, ridge: float = 0.0, rtol: float = 1e-10) -> RRResult:
    """Solve the Rayleigh-Ritz problem from accumulated moments (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"rr mode={mode!r} is unknown; allowed: {', '.join(MODES)}")
    if (mode == "svd") != acc.pairs:
        raise ValueError(
            f"rr mode={mode!r} does not fit this data: use 'svd' for two encoders (pairs) and one of "
            f"{', '.join(m for m in MODES if m != 'svd')} for one encoder on two views"
        )
    center = center or mode == "paper-vicreg"  # the paper's VICReg algorithm is centered (Welford)
    gff, ggg, kfg, mf, mg = acc.second_moments(center)
    right = right_mean = None

    if mode == "svd":
        wf = _inverse_sqrt(gff, ridge, rtol, "the x-side embedding")
        wg = _inverse_sqrt(ggg, ridge, rtol, "the a-side embedding")
        u, s, vh = torch.linalg.svd(wf @ kfg @ wg)
        k = min(acc.dim, acc.dim_right)
        values, transform, right, right_mean = s[:k], wf @ u[:, :k], wg @ vh[:k].T, mg
        _fix_signs(transform, right)
        return RRResult(values, transform, mf, mode, acc.n, right, right_mean)

    gram = (gff + ggg) / 2  # both views sample the same marginal
    cross = (kfg + kfg.T) / 2  # T is self-adjoint: symmetrize the estimate
    if mode == "generalized":
        w = _inverse_sqrt(gram, ridge, rtol, "the embedding")
        values, y = _descending_eigh(w @ cross @ w)
        transform = w @ y
    elif mode in ("paper-rq", "paper-vicreg"):  # Algorithms F.1 / F.2: the basis is taken as orthonormal
        values, transform = _descending_eigh(cross)
    else:  # paper-lora, Algorithm F.3: LoRA features are Q sqrt(Sigma) psi*, so the Gram's spectrum
        values, u = _descending_eigh(_ridged(gram, ridge))  # the ridge enters Sigma^{-1/2} as in the other modes
        _check_conditioned(values.flip(0), rtol, "the embedding")
        transform = u * values.rsqrt()
    _fix_signs(transform)
    return RRResult(values, transform, mf, mode, acc.n)
