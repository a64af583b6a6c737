"""Rayleigh-Ritz's sufficient statistics: float64 means and centered co-moments of positive pairs, merged
exactly (Chan's parallel update) across batches, workers, ranks and folds (eigtrain.export.rayleigh_ritz solves them)."""

from __future__ import annotations

import torch

FOLDS_BYTES = 8 << 30  # the most the folds' float64 co-moments may hold
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


def _synced(name: str) -> property:
    """A statistic of the whole, merged from the folds when read (RRAccumulator._sync)."""

    def get(self):
        self._sync()
        return getattr(self, "_" + name)

    def put(self, value):
        setattr(self, "_" + name, value)

    return property(get, put)


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
            for fold in self.folds or ():
                self._merge(fold.n, fold.mean_f, fold.mean_g, fold.c_ff, fold.c_gg, fold.c_fg)

    n, mean_f, mean_g = _synced("n"), _synced("mean_f"), _synced("mean_g")
    c_ff, c_gg, c_fg = _synced("c_ff"), _synced("c_gg"), _synced("c_fg")

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
