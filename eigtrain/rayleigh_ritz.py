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

MODES = ("generalized", "paper-rq", "paper-vicreg", "paper-lora", "svd")
TRIVIAL = ("exclude", "keep")
FOLDS_BYTES = 8 << 30  # the most the folds' float64 co-moments may hold
IN_SPAN_TOL = 1e-6  # mean-square residual below which the span counts as holding the constant
F64 = torch.float64


def _batch_moments(f: torch.Tensor, g: torch.Tensor):
    """(n, mean f, mean g, centered co-moment sums ff, gg, fg) of one batch, for `RRAccumulator._merge`."""
    mf, mg = f.mean(0), g.mean(0)
    fc, gc = f - mf, g - mg
    return len(f), mf, mg, _t_matmul(fc, fc), _t_matmul(gc, gc), _t_matmul(fc, gc)


def _t_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b. On the CPU through numpy's BLAS, which runs float64 products about twice as fast as torch's here
    (tools/bench_rr_scale.py: the pass is bound by these products); elsewhere torch's."""
    if a.device.type != "cpu":
        return a.T @ b
    return torch.from_numpy(a.numpy().T @ b.numpy())


class RRAccumulator:
    """Streaming float64 statistics of pairs: count, means, centered co-moment sums."""

    def __init__(self, dim: int, pairs: bool = False, dim_right: int | None = None, device="cpu", folds: int = 0):
        if dim_right is not None and not pairs:
            raise ValueError("dim_right is only meaningful for pairs=True (two encoders)")
        self.dim, self.pairs = dim, pairs
        self.dim_right = dim_right or dim
        if not pairs and self.dim_right != dim:
            raise ValueError("one encoder on two views needs equal dimensions")
        self.device = device
        self._reset()
        # folds: the statistics of `folds` disjoint parts of the rows (rr_prefixes.cut_errors, one encoder only);
        # every update then says each row's fold, by something that does not depend on the ranks. Rows go into
        # their fold only; the whole is their exact merge, made when it is read (`_sync`): one merge per row.
        # their co-moments take at most FOLDS_BYTES: d = 8,192 keeps 5 folds (1.5 GiB each), d <= 4,096 keeps 8
        keep = folds > 1 and not pairs
        folds = min(folds, max(2, FOLDS_BYTES // (24 * dim * self.dim_right)))
        self.folds = tuple(RRAccumulator(dim, pairs, dim_right, device) for _ in range(folds)) if keep else None
        self._stale = False

    def _reset(self) -> None:
        d, e = self.dim, self.dim_right
        zeros = lambda *s: torch.zeros(*s, dtype=F64, device=self.device)  # noqa: E731
        self._n = 0
        self._mean_f, self._mean_g = zeros(d), zeros(e)
        self._c_ff, self._c_gg, self._c_fg = zeros(d, d), zeros(e, e), zeros(d, e)

    def _sync(self) -> None:
        """The whole's statistics as the exact merge of its folds' (after updates that went to the folds only)."""
        if self._stale:
            self._stale = False
            self._reset()
            for fold in self.folds:
                self._merge(fold.n, fold.mean_f, fold.mean_g, fold.c_ff, fold.c_gg, fold.c_fg)

    def _synced(name: str):  # noqa: N805 -- a property factory used in the class body
        def get(self):
            self._sync()
            return getattr(self, "_" + name)

        def put(self, value):
            setattr(self, "_" + name, value)

        return property(get, put)

    n, mean_f, mean_g = _synced("n"), _synced("mean_f"), _synced("mean_g")
    c_ff, c_gg, c_fg = _synced("c_ff"), _synced("c_gg"), _synced("c_fg")
    del _synced

    # -- accumulation ---------------------------------------------------------------------
    @torch.no_grad()
    def update(self, z1: torch.Tensor, z2: torch.Tensor, fold: torch.Tensor | None = None) -> None:
        """Add a batch of pairs: z1 (first view or x side), z2 (second view or a side); fold: each row's fold
        (integers in [0, folds)) when the accumulator keeps folds."""
        if z1.ndim != 2 or z1.shape[1] != self.dim or z2.ndim != 2 or z2.shape[1] != self.dim_right:
            raise ValueError(
                f"expected z1 (batch, {self.dim}) and z2 (batch, {self.dim_right}), got "
                f"{tuple(z1.shape)} and {tuple(z2.shape)}"
            )
        if len(z1) != len(z2):
            raise ValueError(f"z1 and z2 must pair up row by row, got {len(z1)} and {len(z2)} rows")
        if len(z1) == 0:
            return
        f, g = z1.to(self.device, F64), z2.to(self.device, F64)
        if not (torch.isfinite(f).all() and torch.isfinite(g).all()):
            raise ValueError("non-finite values in the embeddings given to Rayleigh-Ritz")
        if self.folds is None:
            self._merge(*_batch_moments(f, g))
            return
        if fold is None or len(fold) != len(f):
            raise ValueError("an accumulator that keeps folds needs each row's fold")
        fold = fold.to(f.device, torch.long)
        for i, acc in enumerate(self.folds):  # each row's products once, into its fold
            rows = fold == i
            if rows.any():
                acc._merge(*_batch_moments(f[rows], g[rows]))
                self._stale = True

    def merge(self, other: "RRAccumulator") -> None:
        """Fold another accumulator in (exact: the same result as one pass over both streams)."""
        if (other.dim, other.dim_right, other.pairs) != (self.dim, self.dim_right, self.pairs):
            raise ValueError("cannot merge accumulators of different shapes or modes")
        if self.folds is not None and other.folds is not None and len(self.folds) == len(other.folds):
            for mine, theirs in zip(self.folds, other.folds):
                mine.merge(theirs)
            self._stale = True
            return
        dev = self.device
        self._merge(other.n, *(t.to(dev) for t in (other.mean_f, other.mean_g, other.c_ff, other.c_gg, other.c_fg)))
        self.folds = None  # the other part's rows have no (matching) folds: the folds would not cover the data

    def _merge(self, nb, mf, mg, cff, cgg, cfg) -> None:
        na, n = self._n, self._n + nb
        if nb == 0:
            return
        if na == 0:  # the first part: its statistics as they are
            self._c_ff.copy_(cff), self._c_gg.copy_(cgg), self._c_fg.copy_(cfg)
            self._mean_f.copy_(mf), self._mean_g.copy_(mg)
            self._n = nb
            return
        df, dg = mf - self._mean_f, mg - self._mean_g
        w = na * nb / n
        self._c_ff += cff + w * torch.outer(df, df)
        self._c_gg += cgg + w * torch.outer(dg, dg)
        self._c_fg += cfg + w * torch.outer(df, dg)
        self._mean_f += df * (nb / n)
        self._mean_g += dg * (nb / n)
        self._n = n

    @torch.no_grad()
    def all_reduce(self, group=None) -> None:
        """Combine the accumulators of all ranks in place (two all-reduces of O(d^2))."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return
        if self.folds is not None:  # the whole is the merge of the reduced folds: nothing more to send
            for fold in self.folds:
                fold.all_reduce(group)
            self._stale = True
            return
        # 1) global count and mean; 2) co-moments shifted to the global mean, summed.
        head = torch.cat([self.c_ff.new_tensor([float(self.n)]), self.n * self.mean_f, self.n * self.mean_g])
        dist.all_reduce(head, group=group)
        n = int(round(head[0].item()))
        mean_f, mean_g = head[1 : 1 + self.dim] / max(n, 1), head[1 + self.dim :] / max(n, 1)
        df, dg = self.mean_f - mean_f, self.mean_g - mean_g
        moments = ((self.c_ff, df, df), (self.c_gg, dg, dg), (self.c_fg, df, dg))
        flat = torch.cat([(c + self.n * torch.outer(a, b)).reshape(-1) for c, a, b in moments])
        dist.all_reduce(flat, group=group)
        d, e = self.dim, self.dim_right
        shapes = ((d, d), (e, e), (d, e))
        self.c_ff, self.c_gg, self.c_fg = (t.view(s) for t, s in zip(flat.split([d * d, e * e, d * e]), shapes))
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
        if not self.pairs:  # one encoder: both views share one mean
            pooled = (self.mean_f + self.mean_g) / 2
            mf = mg = pooled if center else torch.zeros_like(pooled)
        else:
            mf = self.mean_f if center else torch.zeros_like(self.mean_f)
            mg = self.mean_g if center else torch.zeros_like(self.mean_g)
        return self.moments_about(mf, mg)

    def moments_about(self, mf: torch.Tensor, mg: torch.Tensor):
        """(E[(f - mf)(f - mf)^T], E[(g - mg)(g - mg)^T], E[(f - mf)(g - mg)^T], mf, mg) about given centres."""
        n = self.n
        af, ag = self.mean_f - mf, self.mean_g - mg  # offsets of the stored means from the centre
        gff = self.c_ff / n + torch.outer(af, af)
        ggg = self.c_gg / n + torch.outer(ag, ag)
        kfg = self.c_fg / n + torch.outer(af, ag)
        return gff, ggg, kfg, mf, mg

    def view_moments(self, center: bool):
        """One encoder on two views: (Gram over both views, symmetrized cross moment), raw or centered. Both views
        sample the same marginal, and T is self-adjoint: the estimate is symmetrized."""
        gff, ggg, kfg, _, _ = self.second_moments(center)
        return (gff + ggg) / 2, (kfg + kfg.T) / 2


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
        return (z.to(F64) - self.right_mean.to(z.device)) @ self.right_transform[:, :k].to(z.device)


def _ridged(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    """G + ridge * (mean eigenvalue of G) * I."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    if ridge == 0:
        return gram
    d = gram.shape[0]
    return gram + ridge * (torch.trace(gram) / d) * torch.eye(d, dtype=F64, device=gram.device)


def _range(gram: torch.Tensor, ridge: float, rtol: float, what: str, n: int | None = None):
    """Eigenpairs of the (ridged) Gram on its numerical range: eigenvalues > rtol * the largest, descending.
    n: the number of pairs; a range as wide as the sample (rank >= n) is refused: n pairs cannot order it."""
    evals, evecs = _descending_eigh(_ridged(gram, ridge))
    if not evals[0] > 0:
        raise ValueError(f"Rayleigh-Ritz: every dimension of {what} is constant over the data (nothing to order)")
    keep = evals > rtol * evals[0]
    if n is not None and int(keep.sum()) >= n:
        raise ValueError(
            f"Rayleigh-Ritz: {n} pairs cannot order {what}'s {int(keep.sum())} live dimensions (the Gram's rank is "
            f"limited by the sample, so any order would be the sample's): give more pairs than dimensions"
        )
    return evals[keep], evecs[:, keep]


def _cholesky_whitener(gram: torch.Tensor, ridge: float, rtol: float, n: int) -> torch.Tensor | None:
    """W = L^-T with W^T G W = I from the (ridged) Gram's Cholesky factor, when the Gram is plainly of full rank:
    the same generalized solve as whitening on the range, for a third of the cost of an eigendecomposition. None
    (the range's eigendecomposition decides) when the factorization fails or the smallest eigenvalue, estimated
    by inverse iteration, is not far above rtol * the largest (or when n pairs could not order d dimensions)."""
    g = _ridged(gram, ridge)
    d = len(g)
    if d >= n:
        return None
    factor, info = torch.linalg.cholesky_ex((g + g.T) / 2)
    if int(info) != 0:
        return None
    x = torch.ones(d, 1, dtype=F64, device=g.device) / d**0.5
    for _ in range(6):  # inverse iteration: any direction of (near) rank deficiency dominates after one step
        x = torch.cholesky_solve(x, factor)
        x = x / x.norm()
    smallest = float((x.T @ g @ x).squeeze())  # an upper bound of the smallest eigenvalue, tight when it stands out
    y = torch.ones(d, 1, dtype=F64, device=g.device) / d**0.5
    for _ in range(10):  # power iteration: a lower bound of the largest eigenvalue, tight within a few steps
        y = g @ y
        y = y / y.norm()
    largest = float((y.T @ g @ y).squeeze())
    if not smallest > 1e3 * rtol * largest:  # a wide margin over the range's own cut (rtol * the largest)
        return None
    eye = torch.eye(d, dtype=F64, device=g.device)
    return torch.linalg.solve_triangular(factor, eye, upper=False).T


def _descending_eigh(sym: torch.Tensor):
    evals, evecs = torch.linalg.eigh((sym + sym.T) / 2)
    return evals.flip(0), evecs.flip(1)


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


def constant_readout(raw_gram: torch.Tensor, mean: torch.Tensor, rtol: float, live=None, full_rank: bool = False):
    """(w, residual): the least-squares w with z @ w ~ 1 under the data (w = G^+ E[z] on G's numerical range,
    over the `live` coordinates only when given) and E[(1 - z @ w)^2] = 1 - E[z]^T w (0: the span holds 1).
    full_rank: the centered Gram has no null direction, so the raw one (it plus the mean's outer product) is
    positive definite: a Cholesky solve instead of an eigendecomposition (a sixth of the cost)."""
    live = torch.ones_like(mean, dtype=torch.bool) if live is None else live
    w = torch.zeros_like(mean)
    if full_rank and live.all():
        factor, info = torch.linalg.cholesky_ex((raw_gram + raw_gram.T) / 2)
        if int(info) == 0:
            w = torch.cholesky_solve(mean[:, None], factor)[:, 0]
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
) -> dict:
    """How the d coordinates were spent: dead (no variance over the data when the constant is excluded, no second
    moment otherwise), constant (1 when live coordinates span the excluded constant), dependent (the rest of
    the rank deficit of the unregularized Gram: `rank` is its numerical rank), features (ordered features exported).
    readout: `constant_readout` over every coordinate, already computed (reused when no coordinate is dead)."""
    diag = torch.diagonal(gram)
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


def solve(
    acc: RRAccumulator,
    mode: str = "generalized",
    center: bool = False,
    ridge: float = 0.0,
    rtol: float = 1e-10,
    trivial: str = "exclude",
) -> RRResult:
    """Solve the Rayleigh-Ritz problem from accumulated moments (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"rr mode={mode!r} is unknown; allowed: {', '.join(MODES)}")
    if trivial not in TRIVIAL:
        raise ValueError(f"rr trivial={trivial!r} is unknown; allowed: {', '.join(TRIVIAL)}")
    if (mode == "svd") != acc.pairs:
        raise ValueError(
            f"rr mode={mode!r} does not fit this data: use 'svd' for two encoders (pairs) and one of "
            f"{', '.join(m for m in MODES if m != 'svd')} for one encoder on two views"
        )
    exclude = trivial == "exclude"
    center = centered(mode, center, trivial)
    gff, ggg, kfg, mf, mg = acc.second_moments(center)
    raw_f, raw_g, _, _, _ = acc.second_moments(False)

    if mode == "svd":
        (sf, uf), (sg, ug) = (
            _range(gff, ridge, rtol, "the x-side embedding", acc.n),
            _range(ggg, ridge, rtol, "the a-side embedding", acc.n),
        )
        wf, wg = uf * sf.rsqrt(), ug * sg.rsqrt()
        u, s, vh = torch.linalg.svd(wf.T @ kfg @ wg)
        k = min(wf.shape[1], wg.shape[1])
        values, transform, right = s[:k], wf @ u[:, :k], wg @ vh[:k].T
        fix_signs(transform, right)
        result = RRResult(values, transform, mf, mode, acc.n, right, mg)
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

    gram, cross = acc.view_moments(center)
    whitener = _cholesky_whitener(gram, ridge, rtol, acc.n) if mode == "generalized" else None
    if whitener is None:
        evals, evecs = _range(gram, ridge, rtol, "the embedding", acc.n)
    extra = {}
    if mode == "generalized":  # the exact solve: whiten by the Gram on its range, then K's eigenbasis there
        w = evecs * evals.rsqrt() if whitener is None else whitener
        values, y = _descending_eigh(w.T @ cross @ w)
        transform = w @ y
        evals = torch.ones(w.shape[1], dtype=F64) if whitener is not None else evals  # only its size is used below
    elif mode in ("paper-rq", "paper-vicreg"):  # Algorithms F.1 / F.2: the basis is taken as orthonormal
        values, y = _descending_eigh(evecs.T @ cross @ evecs)  # (on the range: null directions are zero features)
        transform = evecs @ y
    else:  # paper-lora, Algorithm F.3: LoRA features are Q sqrt(Sigma) psi*, so the Gram's spectrum
        values, transform = evals, evecs * evals.rsqrt()  # the ridge enters Sigma^{-1/2} as in the other modes
    fix_signs(transform)
    result = RRResult(values, transform, mf, mode, acc.n, extra=extra)
    pooled, raw = (acc.mean_f + acc.mean_g) / 2, (raw_f + raw_g) / 2
    readout = constant_readout(raw, pooled, rtol, full_rank=ridge == 0 and len(evals) == len(gram)) if exclude else None
    rank = _rank(gram, ridge, rtol, evals)
    result.dims = _dims_report(gram, raw, pooled, exclude, rtol, transform.shape[1], rank, readout)
    if exclude:
        result.trivial = {"eigenvalue": 1.0, "transform": readout[0], "residual": readout[1]}
    return result
