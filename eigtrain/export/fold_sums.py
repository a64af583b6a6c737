"""One encoder on two views, accumulated per fold in half the products (RRAccumulator's folds; docs/export.md).

Rayleigh-Ritz on one encoder needs only both views' pooled Gram, f f^T + g g^T, and the symmetrized cross moment,
f g^T + g f^T. With a = f + g and b = f - g (about a shift s: the first batch's pooled mean, near the data's),
a a^T + b b^T = 2 (f f^T + g g^T) and a a^T - b b^T = 2 (f g^T + g f^T): two symmetric rank-k updates (BLAS syrk,
in place) give both, where f^T f, g^T g and f^T g cost twice as many flops. Each row's products are computed once,
into its fold; the whole is the exact sum of the folds' sums (all about the same shift), converted once.
"""

from __future__ import annotations

import torch

F64 = torch.float64


def _syrk_into(total: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """total + x^T x, in place where total exists. On the CPU only its upper triangle is kept (BLAS dsyrk into a
    column-major buffer, through scipy: no temporary d x d product); elsewhere torch's full product."""
    if x.device.type != "cpu":
        return x.T @ x if total is None else total.addmm_(x.T, x)
    from scipy.linalg.blas import dsyrk

    # x (k, d) row-major is x^T (d, k) column-major: dsyrk(trans=0) computes x^T x into the upper triangle
    if total is None:
        return torch.from_numpy(dsyrk(1.0, x.numpy().T, trans=0, lower=0))
    out = total.numpy()
    dsyrk(1.0, x.numpy().T, beta=1.0, c=out, trans=0, lower=0, overwrite_c=1)  # column-major: updated in place
    return total


def _symmetric(upper: torch.Tensor) -> torch.Tensor:
    """The full symmetric matrix from `_syrk_into`'s result (CPU: upper triangle only, its lower one zeros: dsyrk
    never writes there, and sums and scalings of such keep them), row-major: U + U^T, its diagonal halved."""
    if upper.device.type != "cpu":
        return upper
    full = upper + upper.T
    full.diagonal().mul_(0.5)
    return full


class PooledFoldSums:
    """Per fold: the row count, sum (f - s), sum (g - s), and P = sum a a^T, M = sum b b^T for a = (f - s) + (g - s),
    b = (f - s) - (g - s). `moments(i)` converts fold i (None: the whole) to RRAccumulator's statistics."""

    def __init__(self, folds: int, dim: int, device="cpu"):
        self.folds, self.dim, self.device = folds, dim, device
        self.shift: torch.Tensor | None = None
        self.n = [0] * folds
        self.sum_f = torch.zeros(folds, dim, dtype=F64, device=device)
        self.sum_g = torch.zeros(folds, dim, dtype=F64, device=device)
        self.plus: list[torch.Tensor | None] = [None] * folds
        self.minus: list[torch.Tensor | None] = [None] * folds

    @property
    def rows(self) -> int:
        return sum(self.n)

    def add(self, f: torch.Tensor, g: torch.Tensor, fold: torch.Tensor) -> None:
        """Rows f, g (float64) into their folds (`fold`: each row's, in [0, folds))."""
        if len(fold) and not 0 <= int(fold.min()) <= int(fold.max()) < self.folds:  # never drop a row
            raise ValueError(f"a row's fold must lie in [0, {self.folds}), got {int(fold.min())}..{int(fold.max())}")
        if self.shift is None:
            self.shift = (f.mean(0) + g.mean(0)) / 2
        for i in range(self.folds):
            rows = fold == i
            k = int(rows.sum())
            if not k:
                continue
            a, c = f[rows] - self.shift, g[rows] - self.shift  # copies: the caller's rows are left as they were
            self.sum_f[i] += a.sum(0)
            self.sum_g[i] += c.sum(0)
            b = a - c
            a += c
            self.plus[i] = _syrk_into(self.plus[i], a)
            self.minus[i] = _syrk_into(self.minus[i], b)
            self.n[i] += k

    def moments(
        self, i: int | None
    ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n, mean f, mean g, c_ff, c_gg, c_fg) of fold i, or of the whole for None: centered co-moment sums with
        c_ff = c_gg = half of both views' and c_fg symmetrized (all one encoder on two views uses). Frees fold i."""
        folds = range(self.folds) if i is None else [i]
        n = sum(self.n[j] for j in folds)
        plus, minus = (self._total(parts, folds) for parts in (self.plus, self.minus))
        if i is not None:
            self.plus[i] = self.minus[i] = None
        sf, sg = self.sum_f[list(folds)].sum(0), self.sum_g[list(folds)].sum(0)
        gram, cross = _symmetric((plus + minus).mul_(0.25)), _symmetric((plus - minus).mul_(0.25))
        del plus, minus
        # about the fold's own means: sum (f - m)(f - m)^T = sum (f - s)(f - s)^T - sf sf^T / n
        gram.addr_(sf, sf, alpha=-0.5 / n).addr_(sg, sg, alpha=-0.5 / n)
        cross.addr_(sf, sg, alpha=-0.5 / n).addr_(sg, sf, alpha=-0.5 / n)
        assert self.shift is not None  # rows were added
        return n, self.shift + sf / n, self.shift + sg / n, gram, gram.clone(), cross

    def _total(self, parts: list, folds) -> torch.Tensor:
        present = [parts[j] for j in folds if parts[j] is not None]
        if len(present) == 1:  # read, never written: (plus + minus) and (plus - minus) are new tensors
            return present[0]
        total = present[0] + present[1]
        for part in present[2:]:
            total += part
        return total
