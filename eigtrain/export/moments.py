"""Rayleigh-Ritz's sufficient statistics: float64 means and centered co-moments of positive pairs, merged
exactly (Chan's parallel update) across batches, workers, ranks and folds (eigtrain.export.rayleigh_ritz solves them)."""

from __future__ import annotations

import torch

from eigtrain.export.fold_sums import PooledFoldSums, t_matmul

FOLDS_BYTES = 8 << 30  # the most the folds' float64 co-moments may hold
F64 = torch.float64


def _batch_moments(f: torch.Tensor, g: torch.Tensor):
    """(n, mean f, mean g, centered co-moment sums ff, gg, fg) of one batch, for `RRAccumulator._merge`."""
    mf, mg = f.mean(0), g.mean(0)
    fc, gc = f - mf, g - mg
    return len(f), mf, mg, t_matmul(fc, fc), t_matmul(gc, gc), t_matmul(fc, gc)


def _synced(name: str) -> property:
    """A statistic of the whole, merged from the folds when read (RRAccumulator._sync); a co-moment never written
    is made (zeros) when first read."""

    def get(self):
        self._sync()
        value = getattr(self, "_" + name)
        if value is None:
            shapes = {"c_ff": (self.dim, self.dim), "c_gg": (self.dim_right,) * 2, "c_fg": (self.dim, self.dim_right)}
            value = torch.zeros(*shapes[name], dtype=F64, device=self.device)
            setattr(self, "_" + name, value)
        return value

    def put(self, value):
        self._sync()  # rows still in the sums would be merged over it when next read
        setattr(self, "_" + name, value)

    return property(get, put)


class RRAccumulator:
    """Streaming float64 statistics of pairs: count, means, centered co-moment sums. One encoder's (pairs=False)
    holds what one encoder on two views uses (eigtrain.export.fold_sums): c_ff + c_gg and the symmetric part of c_fg
    (c_ff and c_gg apart are not each view's own)."""

    def __init__(self, dim: int, pairs: bool = False, dim_right: int | None = None, device="cpu", folds: int = 0):
        if dim_right is not None and not pairs:
            raise ValueError("dim_right is only meaningful for pairs=True (two encoders)")
        self.dim, self.pairs = dim, pairs
        self.dim_right = dim_right or dim
        if not pairs and self.dim_right != dim:
            raise ValueError("one encoder on two views needs equal dimensions")
        self.device = device
        self.input_eps = 0.0  # the machine epsilon of the least precise values seen: the solve's default tolerance
        self._reset()
        # folds: the statistics of `folds` disjoint parts of the rows (rr_prefixes.cut_errors, one encoder only);
        # every update then says each row's fold, by something that does not depend on the ranks. Rows go into
        # their fold's sums only (eigtrain.export.fold_sums: half the products); the folds and the whole are made
        # from them when read (`_sync`). Their co-moments take at most FOLDS_BYTES: d = 8,192 keeps 5 folds
        # (1.5 GiB each), d <= 4,096 keeps 8. Without folds one encoder's rows go into the same sums as one fold
        # (a third of the flops of f^T f, g^T g and f^T g per batch); two encoders' through `_batch_moments`
        keep = folds > 1 and not pairs
        folds = min(folds, max(2, FOLDS_BYTES // (24 * dim * self.dim_right)))
        self.fold_count = folds if keep else 0
        self._folds = tuple(RRAccumulator(dim, pairs, dim_right, device) for _ in range(folds)) if keep else None
        self._sums = None if pairs else PooledFoldSums(self.fold_count or 1, dim, device)
        self._pending: list[PooledFoldSums] = []  # sums read into the whole, not yet into the folds' accumulators
        self._stale = False

    @property
    def folds(self) -> "tuple[RRAccumulator, ...] | None":
        """The folds' accumulators (None when none are kept), their statistics up to date."""
        self._sync()
        self._fill_folds()
        return self._folds

    @property
    def fold_sizes(self) -> list[int] | None:
        """Each fold's row count (None when no folds are kept), without converting the folds' sums."""
        self._sync()
        if self._folds is None:
            return None
        return [fold.n + sum(sums.n[i] for sums in self._pending) for i, fold in enumerate(self._folds)]

    def pending_leaks(self, t: torch.Tensor, m: int, centre: torch.Tensor, head_values: torch.Tensor) -> list | None:
        """Each fold's t[:, :m]^T K t - diag(head_values) t[:, :m]^T G t about `centre` straight from the rows' sums
        (PooledFoldSums.leaks), when those hold all of every fold; None otherwise (the folds' accumulators do)."""
        self._sync()
        if self._folds is None or len(self._pending) != 1 or any(fold.n for fold in self._folds):
            return None
        return self._pending[0].leaks(t, m, centre, head_values)

    def _reset(self) -> None:
        d, e = self.dim, self.dim_right
        zeros = lambda *s: torch.zeros(*s, dtype=F64, device=self.device)  # noqa: E731
        self._n = 0
        self._mean_f, self._mean_g = zeros(d), zeros(e)
        self._c_ff = self._c_gg = self._c_fg = None  # made by the first merge (or zeros when read first: `_synced`)

    def _sync(self) -> None:
        """The whole's statistics from the rows' sums (the exact sum of the folds'), or as the exact merge of its
        folds' (after an all-reduce or a merge of folds). The folds' own are converted only when asked for
        (`folds`): the per-cut test reads them projected, from the sums (`pending_leaks`)."""
        sums = self._sums
        if sums is not None and sums.rows:
            self._sums = PooledFoldSums(sums.folds, self.dim, self.device)  # for rows added later
            sums.release()
            if not self._stale:  # the whole: its conversion reads every fold's sums
                self._merge(*sums.moments(None), fresh=True)
            if self._folds is not None:
                self._pending.append(sums)
        if self._stale:
            self._stale = False
            self._fill_folds()
            self._reset()
            for fold in self._folds or ():
                self._merge(fold.n, fold.mean_f, fold.mean_g, fold.c_ff, fold.c_gg, fold.c_fg)

    def _fill_folds(self) -> None:
        """The folds' accumulators += the sums read into the whole so far."""
        for sums in self._pending:
            for i, fold in enumerate(self._folds or ()):
                if sums.n[i]:
                    fold._merge(*sums.moments(i), fresh=True)
        self._pending = []

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
        for z in (z1, z2):
            self.input_eps = max(self.input_eps, torch.finfo(z.dtype if z.is_floating_point() else F64).eps)
        if self._sums is not None:  # each row's products once, into its fold (which checks the values)
            if self._folds is None:  # the sums' one fold
                fold = torch.zeros(len(z1), dtype=torch.long)
            elif fold is None or len(fold) != len(z1):
                raise ValueError("an accumulator that keeps folds needs each row's fold")
            self._sums.add(z1, z2, fold.to(torch.long))  # read in their own dtype: converted as they are shifted
            return
        f, g = z1.to(self.device, F64), z2.to(self.device, F64)
        # a NaN or inf makes its column's sum non-finite: one pass per view, no mask of the batch's size
        if not (torch.isfinite(f.sum(0)).all() and torch.isfinite(g.sum(0)).all()):
            raise ValueError("non-finite values in the embeddings given to Rayleigh-Ritz")
        self._merge(*_batch_moments(f, g))

    def merge(self, other: "RRAccumulator") -> None:
        """Fold another accumulator in (exact: the same result as one pass over both streams)."""
        if (other.dim, other.dim_right, other.pairs) != (self.dim, self.dim_right, self.pairs):
            raise ValueError("cannot merge accumulators of different shapes or modes")
        if self.folds is not None and other.folds is not None and len(self.folds) == len(other.folds):
            self.input_eps = max(self.input_eps, other.input_eps)
            for mine, theirs in zip(self.folds, other.folds):
                mine.merge(theirs)
            self._stale = True
            return
        self.input_eps = max(self.input_eps, other.input_eps)
        dev = self.device
        self._merge(other.n, *(t.to(dev) for t in (other.mean_f, other.mean_g, other.c_ff, other.c_gg, other.c_fg)))
        self._folds = None  # the other part's rows have no (matching) folds: they would not cover the data
        self._sums = None if self.pairs else PooledFoldSums(1, self.dim, self.device)
        self._pending, self.fold_count = [], 0

    def _merge(self, nb, mf, mg, cff, cgg, cfg, fresh: bool = False) -> None:
        """Chan's update with another part's (count, means, centered co-moment sums); fresh: the co-moments are
        new tensors, taken as they are by an empty accumulator (else copied)."""
        na, n = self._n, self._n + nb
        if nb == 0:
            return
        if na == 0:  # the first part: its statistics as they are
            own = (cff, cgg, cfg) if fresh else (cff.clone(), cgg.clone(), cfg.clone())
            self._c_ff, self._c_gg, self._c_fg = own
            self._mean_f.copy_(mf), self._mean_g.copy_(mg)
            self._n = nb
            return
        df, dg = mf - self._mean_f, mg - self._mean_g
        w = na * nb / n
        assert self._c_ff is not None and self._c_gg is not None and self._c_fg is not None  # set with na > 0
        self._c_ff.add_(cff).addr_(df, df, alpha=w)  # in place: no temporary of d x d
        self._c_gg.add_(cgg).addr_(dg, dg, alpha=w)
        self._c_fg.add_(cfg).addr_(df, dg, alpha=w)
        self._mean_f += df * (nb / n)
        self._mean_g += dg * (nb / n)
        self._n = n

    @torch.no_grad()
    def all_reduce(self, group=None) -> None:
        """Combine the accumulators of all ranks in place (two all-reduces of O(d^2))."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return
        eps = torch.tensor([self.input_eps], dtype=F64, device=self.device)
        dist.all_reduce(eps, op=dist.ReduceOp.MAX, group=group)  # every rank: the least precise input of any
        self.input_eps = float(eps.item())
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
        moments = {k: getattr(self, k).clone() for k in ("mean_f", "mean_g", "c_ff", "c_gg", "c_fg")}
        return {"n": self.n, "input_eps": self.input_eps, **moments}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state["n"])
        self.input_eps = float(state.get("input_eps", 0.0))
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
        """One encoder on two views: (Gram over both views, symmetrized cross moment), raw or centered (about the
        pooled mean). Both views sample the same marginal, and T is self-adjoint: the estimate is symmetrized. Made
        from the sums directly: no per-view d x d moment on the way."""
        af, ag = self._view_offsets(center)
        cross = (self.c_fg + self.c_fg.T).div_(2 * self.n).addr_(af, ag, alpha=0.5).addr_(ag, af, alpha=0.5)
        return self.view_gram(center), cross

    def view_gram(self, center: bool) -> torch.Tensor:
        """view_moments' Gram alone (no d x d pass spent on the cross moment)."""
        af, ag = self._view_offsets(center)
        return (self.c_ff + self.c_gg).div_(2 * self.n).addr_(af, af, alpha=0.5).addr_(ag, ag, alpha=0.5)

    def _view_offsets(self, center: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each view's mean less the centre (the pooled mean, or 0 for raw moments)."""
        if self.n < 2:
            raise ValueError(f"Rayleigh-Ritz needs at least 2 pairs, got {self.n}")
        pooled = (self.mean_f + self.mean_g) / 2
        return (self.mean_f - pooled, self.mean_g - pooled) if center else (self.mean_f, self.mean_g)
