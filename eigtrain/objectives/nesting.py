"""Prefix sets and the masks that turn a sum over nested prefix losses into one masked sum.

Joint nesting minimizes sum_k w_k L(first k coordinates). Every objective here is a sum of per-mode
terms (index i) and pairwise terms (indices i, j). A per-mode term enters every prefix k >= i, a pairwise
term every prefix k >= max(i, j). With per-prefix factors g(k) (e.g. mu / k), the nested sum therefore
weights mode i by c_i = sum_{k in K, k >= i} w_k g(k) and pair (i, j) by c_{max(i, j)}: one O(d^2) mask
instead of a loop over prefixes.

Sequential nesting (stop-gradient) keeps the same loss value, but mode k receives gradient only from
L_k, i.e. from the terms whose largest index is k, weighted by w_k g(k) alone ("own" masks).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

MODES = ("none", "joint", "sequential")


def mrl_prefixes(dim: int) -> list[int]:
    """Matryoshka-style prefix set {4, 8, 16, ..., dim} (dim itself always included)."""
    prefixes, k = [], 4
    while k < dim:
        prefixes.append(k)
        k *= 2
    return prefixes + [dim]


class Nesting:
    """A validated prefix set K with positive weights w_k, and the masks derived from it."""

    def __init__(
        self,
        mode: str,
        dim: int,
        prefixes: Sequence[int] | str | None = None,
        weights: Sequence[float] | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"nesting={mode!r} is unknown; allowed: {', '.join(MODES)}")
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        self.mode, self.dim = mode, dim

        if mode == "none":
            if prefixes is not None or weights is not None:
                raise ValueError("nesting='none' takes no prefixes or weights; use nesting='joint'")
            prefixes, weights = [dim], [1.0]
        elif prefixes is None or prefixes == "all":
            prefixes = list(range(1, dim + 1))
        elif prefixes == "mrl":
            prefixes = mrl_prefixes(dim)
        elif isinstance(prefixes, str):
            raise ValueError(f"prefixes={prefixes!r} is unknown; allowed: 'all', 'mrl' or a list of ints")

        prefixes = [int(k) for k in prefixes]
        bad = [k for k in prefixes if not 1 <= k <= dim]
        if bad:
            raise ValueError(f"prefixes {bad} lie outside 1..dim={dim}")
        if len(set(prefixes)) != len(prefixes):
            raise ValueError(f"prefixes contain duplicates: {prefixes}")
        if mode == "sequential" and sorted(prefixes) != list(range(1, dim + 1)):
            raise ValueError("nesting='sequential' trains mode by mode and needs all prefixes 1..dim")

        if weights is None:
            weights = [1.0 / len(prefixes)] * len(prefixes)  # the paper: average over prefixes
        weights = [float(w) for w in weights]
        if len(weights) != len(prefixes):
            raise ValueError(f"{len(weights)} weights given for {len(prefixes)} prefixes")
        if any(not w > 0 for w in weights):
            raise ValueError(f"prefix weights must be positive, got {weights}")

        order = sorted(range(len(prefixes)), key=prefixes.__getitem__)
        self.prefixes = [prefixes[i] for i in order]
        self.weights = [weights[i] for i in order]
        idx = torch.arange(dim)
        self._max_index = torch.maximum(idx[:, None], idx[None, :])

    @property
    def sequential(self) -> bool:
        return self.mode == "sequential"

    def prefix_factors(self, g: Callable[[int], float] | None = None) -> torch.Tensor:
        """u_k = w_k g(k) at each prefix k (0-based position k-1), zero elsewhere, float64."""
        u = torch.zeros(self.dim, dtype=torch.float64)
        for k, w in zip(self.prefixes, self.weights):
            u[k - 1] = w * (1.0 if g is None else g(k))
        return u

    def masks(self, g: Callable[[int], float] | None = None, own: bool = False):
        """(per-mode weights c_i, pairwise weights C_ij = c_max(i,j)), both float64.

        own=False: cumulative weights of the nested sum (the loss value).
        own=True: the weight of the one prefix loss that trains each mode (sequential gradients).
        """
        u = self.prefix_factors(g)
        c = u if own else u.flip(0).cumsum(0).flip(0)
        return c, c[self._max_index]
