"""One encoder on two views, accumulated per fold in half the products (RRAccumulator's folds; docs/export.md).

Rayleigh-Ritz on one encoder needs only both views' pooled Gram, f f^T + g g^T, and the symmetrized cross moment,
f g^T + g f^T. With a = f + g and b = f - g (about a shift s: the first batch's pooled mean, near the data's),
a a^T + b b^T = 2 (f f^T + g g^T) and a a^T - b b^T = 2 (f g^T + g f^T): two symmetric rank-k updates (BLAS syrk,
in place) give both, where f^T f, g^T g and f^T g cost twice as many flops. Each row's products are computed once,
into its fold; the whole is the exact sum of the folds' sums (all about the same shift), converted once.

On the CPU a batch is read once: each fold's rows (a strided view when the folds follow the row, as for embedding
files) are shifted straight from the stored dtype into float64 and gathered fold by fold into one buffer, so the
products run on contiguous blocks with no mask, copy or conversion of the batch on the way.
"""

from __future__ import annotations

import mmap

import numpy as np
import torch

F64 = torch.float64
PIECE_ELEMENTS = 1 << 22  # rows of a piece x d: its three float64 buffers take 96 MiB, syrk still runs at full speed


def _syrk_into(total: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """total + x^T x, in place where total exists. On the CPU only its upper triangle is kept (BLAS dsyrk into a
    column-major buffer, through scipy: no temporary d x d product); elsewhere torch's full product."""
    if x.device.type != "cpu":
        return x.T @ x if total is None else total.addmm_(x.T, x)
    from scipy.linalg.blas import dsyrk

    # x (k, d) row-major is x^T (d, k) column-major: dsyrk(trans=0) computes x^T x into the upper triangle
    if total is None:
        total = _lazy_zeros(x.shape[1])
    out = total.numpy()
    dsyrk(1.0, x.numpy().T, beta=1.0, c=out, trans=0, lower=0, overwrite_c=1)  # column-major: updated in place
    return total


def _lazy_zeros(d: int) -> torch.Tensor:
    """d x d zeros, column-major, in fresh anonymous memory: the kernel supplies each page zeroed on its first touch,
    and dsyrk touches the upper triangle's only (half the page faults of a filled buffer; numpy's zeros asks for
    huge pages, which cost more faults here than torch's filled memory did)."""
    buffer = mmap.mmap(-1, d * d * 8)
    return torch.from_numpy(np.frombuffer(buffer, dtype=np.float64).reshape(d, d)).T


def symmetric(upper: torch.Tensor) -> torch.Tensor:
    """The full symmetric matrix from `_syrk_into`'s result (CPU: upper triangle only, its lower one zeros: dsyrk
    never writes there, and sums and scalings of such keep them), row-major: U + U^T, its diagonal halved."""
    if upper.device.type != "cpu":
        return upper
    full = upper + upper.T
    full.diagonal().mul_(0.5)
    return full


def _symmetric_times(upper: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """S x for S whose kept triangle `_syrk_into` holds (CPU: BLAS dsymm reads the upper one only)."""
    if upper.device.type != "cpu":
        return upper @ x
    from scipy.linalg.blas import dsymm

    return torch.from_numpy(dsymm(1.0, upper.numpy(), x.numpy(), side=0, lower=0))


def t_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b. On the CPU through numpy's BLAS, which runs float64 products about twice as fast as torch's here
    (tools/bench_rr_scale.py: the pass is bound by these products); elsewhere torch's."""
    if a.device.type != "cpu":
        return a.T @ b
    return torch.from_numpy(a.numpy().T @ b.numpy())


def _pieces(rows: slice | np.ndarray, length: int, size: int) -> list[slice | np.ndarray]:
    """A fold's rows of a batch of `length` (`fold_rows`) in pieces of at most `size`, in order."""
    index = range(length)[rows] if isinstance(rows, slice) else rows
    parts = [index[j : j + size] for j in range(0, len(index), size)]
    return [slice(p.start, p.stop, p.step) if isinstance(p, range) else p for p in parts]


def _numpy_rows(x: torch.Tensor) -> np.ndarray:
    """x's values as a numpy array of a float dtype numpy converts exactly to float64 (anything else: float64)."""
    if x.dtype not in (torch.float16, torch.float32, F64):
        x = x.to(F64)
    return x.detach().cpu().numpy()


def fold_rows(fold: torch.Tensor, folds: int) -> list[slice | np.ndarray]:
    """Each fold's rows of a batch: a slice when the folds are contiguous blocks (the rows of embedding files) or
    fold[j] = (fold[0] + j) mod folds, else their indices."""
    k = len(fold)
    first = int(fold[0]) if k else 0
    if torch.equal(fold, (torch.arange(k) + first) % folds):
        return [slice((i - first) % folds, None, folds) for i in range(folds)]
    values = fold.numpy()
    if k and bool((values[1:] >= values[:-1]).all()):  # contiguous blocks (embedding files): a slice per fold
        edges = np.searchsorted(values, np.arange(folds + 1))
        return [slice(int(edges[i]), int(edges[i + 1])) for i in range(folds)]
    return [np.flatnonzero(values == i) for i in range(folds)]


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
        self._scratch: torch.Tensor | None = None  # `_buffers`

    @property
    def rows(self) -> int:
        return sum(self.n)

    def add(self, f: torch.Tensor, g: torch.Tensor, fold: torch.Tensor) -> None:
        """Rows f, g (any float dtype: float64 is what is summed) into their folds (`fold`: each row's, in
        [0, folds)). Non-finite values raise ValueError before anything is added."""
        if len(fold) and not 0 <= int(fold.min()) <= int(fold.max()) < self.folds:  # never drop a row
            raise ValueError(f"a row's fold must lie in [0, {self.folds}), got {int(fold.min())}..{int(fold.max())}")
        if torch.device(self.device).type != "cpu":
            return self._add_rows(f.to(self.device, F64), g.to(self.device, F64), fold.to(self.device))
        self._add_cpu(_numpy_rows(f), _numpy_rows(g), fold.cpu())

    def _add_cpu(self, x: np.ndarray, y: np.ndarray, fold: torch.Tensor) -> None:
        """Fold by fold, a piece of rows at a time: shifted straight from the stored dtype into a small buffer kept
        across batches (fresh memory is costly to touch), then the products."""
        # a NaN makes the extremes NaN, an inf one of them: checked before any fold (or the shift) is touched, in
        # the stored dtype (a third of the time of a float64 sum, the check's cost before)
        if not all(np.isfinite(v.max()) and np.isfinite(v.min()) for v in (x, y) if v.size):
            raise ValueError("non-finite values in the embeddings given to Rayleigh-Ritz")
        if self.shift is None:  # the first batch's pooled mean (float64 sums of the stored values)
            self.shift = torch.from_numpy(x.sum(0, dtype=np.float64) / len(x) + y.sum(0, dtype=np.float64) / len(y)) / 2
        shift = self.shift.numpy()
        for i, rows in enumerate(fold_rows(fold, self.folds)):
            for piece in _pieces(rows, len(fold), max(256, PIECE_ELEMENTS // self.dim)):
                a, c, b = self._buffers(len(range(len(fold))[piece]) if isinstance(piece, slice) else len(piece))
                np.subtract(x[piece], shift, out=a.numpy())  # the stored values, exactly, then shifted
                np.subtract(y[piece], shift, out=c.numpy())
                self._add_products(i, a, c, b)

    def _buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Three float64 buffers of `rows` rows (a, c and a - c of a piece), from one kept until `release`."""
        d = self.dim
        if self._scratch is None or len(self._scratch) < 3 * rows * d:
            self._scratch = torch.empty(3 * rows * d, dtype=F64)
        a, c, b = self._scratch[: 3 * rows * d].split(rows * d)
        return a.view(rows, d), c.view(rows, d), b.view(rows, d)

    def release(self) -> None:
        """Drop the pieces' buffer (no more rows will come)."""
        self._scratch = None

    def _add_rows(self, f: torch.Tensor, g: torch.Tensor, fold: torch.Tensor) -> None:
        """Off the CPU: each fold's rows by a mask (torch's products)."""
        if not (torch.isfinite(f.sum(0)).all() and torch.isfinite(g.sum(0)).all()):
            raise ValueError("non-finite values in the embeddings given to Rayleigh-Ritz")
        if self.shift is None:
            self.shift = (f.mean(0) + g.mean(0)) / 2
        for i in range(self.folds):
            rows = fold == i
            if rows.any():
                a, c = f[rows] - self.shift, g[rows] - self.shift  # copies: the caller's rows are left as they were
                self._add_products(i, a, c)

    def _add_products(self, i: int, a: torch.Tensor, c: torch.Tensor, b: torch.Tensor | None = None) -> None:
        """Fold i += the rows a = f - s, c = g - s (a overwritten; b: a buffer for a - c). On the CPU a + c and a - c
        through numpy's single-threaded loops: torch's threads would contend with the BLAS threads."""
        self.sum_f[i] += a.sum(0)  # torch's: cascaded sums (numpy's along rows are sequential, less accurate)
        self.sum_g[i] += c.sum(0)
        if a.device.type == "cpu":
            an, cn = a.numpy(), c.numpy()
            b = torch.from_numpy(np.subtract(an, cn, out=None if b is None else b.numpy()))
            np.add(an, cn, out=an)
        else:
            b = a - c
            a += c
        self.plus[i] = _syrk_into(self.plus[i], a)
        self.minus[i] = _syrk_into(self.minus[i], b)
        self.n[i] += len(a)

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
        gram, cross = symmetric((plus + minus).mul_(0.25)), symmetric((plus - minus).mul_(0.25))
        del plus, minus
        # about the fold's own means: sum (f - m)(f - m)^T = sum (f - s)(f - s)^T - sf sf^T / n
        gram.addr_(sf, sf, alpha=-0.5 / n).addr_(sg, sg, alpha=-0.5 / n)
        cross.addr_(sf, sg, alpha=-0.5 / n).addr_(sg, sf, alpha=-0.5 / n)
        assert self.shift is not None  # rows were added
        return n, self.shift + sf / n, self.shift + sg / n, gram, gram.clone(), cross

    def leaks(self, t: torch.Tensor, m: int, centre: torch.Tensor, head_values: torch.Tensor) -> list[torch.Tensor]:
        """Per fold, h^T K t - diag(lambda) h^T G t about `centre` in the basis t (h = t[:, :m], lambda =
        head_values: the eigenvalues of h's columns; G the Gram over both views and K the symmetrized cross moment,
        each fold's own E[.]), as rr_prefixes' test reads them, without converting any fold. With u = sum (f - s) +
        (g - s) and e = centre - s: 2n G = (P + M) / 2 + R and 2n K = (P - M) / 2 + R, R = 2n e e^T - u e^T - e u^T,
        so 2n (K - G lambda) = (P h (1 - lambda) - M h (1 + lambda)) / 2 + R (1 - lambda). The products: P h and M h
        (the kept triangle), then one product of all the folds' with t (half the rows the Gram and the cross moment
        would take apart)."""
        assert self.shift is not None  # rows were added
        head, e = t[:, :m], (centre - self.shift).to(t.dtype)
        lam = head_values.to(t.dtype)
        stacked = []
        for plus, minus in zip(self.plus, self.minus):
            if plus is None or minus is None:
                stacked.append(torch.zeros_like(head))
                continue
            ph, mh = _symmetric_times(plus, head), _symmetric_times(minus, head)
            stacked.append(ph.mul_(0.5 * (1 - lam)).sub_(mh.mul_(0.5 * (1 + lam))))
        products = t_matmul(torch.cat(stacked, 1), t).split(m)  # (S h)^T t = h^T S t, S symmetric
        h_e, t_e = head.T @ e, t.T @ e
        out = []
        for i, n in enumerate(self.n):
            u = self.sum_f[i] + self.sum_g[i]
            rank_one = (
                torch.outer(h_e, t_e).mul_(2 * n).sub_(torch.outer(head.T @ u, t_e)).sub_(torch.outer(h_e, t.T @ u))
            )
            out.append(products[i].add_(rank_one.mul_((1 - lam)[:, None])).div_(max(2 * n, 1)))
        return out

    def _total(self, parts: list, folds) -> torch.Tensor:
        present = [parts[j] for j in folds if parts[j] is not None]
        if len(present) == 1:  # read, never written: (plus + minus) and (plus - minus) are new tensors
            return present[0]
        total = present[0] + present[1]
        for part in present[2:]:
            total += part
        return total
