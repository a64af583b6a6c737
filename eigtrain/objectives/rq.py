"""Rayleigh-quotient objectives with unbiased split-batch penalties.

RQ: E||f - g||^2 + (mu/d) sum_i (E[f_i^2] - 1)^2 + (nu/(d(d-1))) sum_{i != j} (E[f_i f_j])^2.
A squared population moment (E[.])^2 is estimated without bias by the product of the estimates on two
disjoint halves of the batch (A = even positions, B = odd positions); the linear term uses the whole batch.
With nesting, the per-prefix normalizers mu/k and nu/(k(k-1)) fold into the masks.

RQ-direct (the paper's theorem on permutation-identified eigenfunctions) penalizes the off-diagonal of
the cross moment E[f_i(a) f_j(a+)] instead of E[f_i f_j]: its minimizers are eigenfunctions themselves.
"""

from __future__ import annotations

import torch

from eigtrain.objectives.base import Objective
from eigtrain.objectives.moments import device_scalar, gram, split_even_odd
from eigtrain.schema.objectives import RqConfig, coefficients_of


def _pair_factor(nu: float):
    return lambda k: nu / (k * (k - 1)) if k > 1 else 0.0


class RQ(Objective):
    name = "rq"
    defaults = coefficients_of(RqConfig)
    split_batch = True

    def __init__(self, dim, nesting, distributed=True, pairs=None, **coefficients):
        super().__init__(dim, nesting, distributed, pairs, **coefficients)
        mu, nu = float(self.coef["mu"]), float(self.coef["nu"])
        if mu < 0 or nu < 0:
            raise ValueError(f"penalty coefficients must be non-negative, got mu={mu}, nu={nu}")
        self.register_masks("inv")
        self.register_masks("var", lambda k: mu / k)
        self.register_masks("cov", _pair_factor(nu))

    def prepare(self, f, g):
        if self.coef["center"]:
            f, g = self.center(f, g)
        return f, g, None

    def moments(self, f, g, sequential, ctx):
        (fa, fb), (ga, gb) = split_even_odd(f), split_even_odd(g)
        s = {
            "n": device_scalar(len(f), f),
            "n_a": device_scalar(len(fa), f),
            "n_b": device_scalar(len(fb), f),
            "diff2": (f - g).pow(2).sum(0),
        }
        if self.pairs:  # two encoders: each side has its own constraint
            s.update(FA=gram(fa, fa, sequential), FB=gram(fb, fb, sequential))
            s.update(GA=gram(ga, ga, sequential), GB=gram(gb, gb, sequential))
        else:  # one encoder: both views are samples of the same marginal
            s.update(A=gram(fa, fa, sequential) + gram(ga, ga, sequential))
            s.update(B=gram(fb, fb, sequential) + gram(gb, gb, sequential))
        s.update(self.cross_moments(fa, fb, ga, gb, sequential))
        return s

    def cross_moments(self, fa, fb, ga, gb, sequential):
        return {}

    def sides(self, s):
        """(split-A sum, split-B sum, samples per row) for each constrained Gram."""
        if self.pairs:
            return [(s["FA"], s["FB"], 1.0), (s["GA"], s["GB"], 1.0)]
        return [(s["A"], s["B"], 2.0)]

    def off_diagonal_pairs(self, s):
        """The (split-A, split-B) second moments whose off-diagonal is penalized."""
        return [(a / (r * s["n_a"]), b / (r * s["n_b"])) for a, b, r in self.sides(s)]

    def combine(self, s, own):
        n = s["n"]
        c_inv = self.mask("inv", own, s["diff2"])
        c_var = self.mask("var", own, s["diff2"])
        C_cov = self.mask("cov", own, s["diff2"], matrix=True)
        off = 1.0 - torch.eye(self.dim, dtype=C_cov.dtype, device=C_cov.device)

        invariance = (c_inv * s["diff2"]).sum() / n
        variance = covariance = 0.0
        for a, b, rows in self.sides(s):
            da, db = torch.diagonal(a) / (rows * s["n_a"]), torch.diagonal(b) / (rows * s["n_b"])
            d_all = (torch.diagonal(a) + torch.diagonal(b)) / (rows * n)
            variance = variance + (c_var * (da * db - 2.0 * d_all + 1.0)).sum()
        for ma, mb in self.off_diagonal_pairs(s):
            covariance = covariance + (C_cov * off * ma * mb).sum()
        loss = invariance + variance + covariance
        return loss, {"invariance": invariance, "variance": variance, "covariance": covariance}


class RQDirect(RQ):
    """RQ whose off-diagonal penalty acts on the symmetrized cross moment <psi_i, T psi_j>."""

    name = "rq_direct"
    allows_pairs = False

    def cross_moments(self, fa, fb, ga, gb, sequential):
        return {
            "KA": gram(fa, ga, sequential) + gram(ga, fa, sequential),
            "KB": gram(fb, gb, sequential) + gram(gb, fb, sequential),
        }

    def off_diagonal_pairs(self, s):
        return [(s["KA"] / (2.0 * s["n_a"]), s["KB"] / (2.0 * s["n_b"]))]
