"""VICReg exactly as the paper writes it (appendix G, eqn. "vicreg"; lambda=50, mu=25, nu=512, eps=1e-4):

    L = lam/n sum_p ||psi~(a_p) - psi~(a_p+)||^2 + mu/d sum_i relu(1 - sqrt(C_ii + eps))
        + nu/(d(d-1)) sum_{i != j} C_ij^2,     C = psi~^T psi~ / (n - 1),  psi~ = psi - batch mean.

Differences from the widely used form (`vicreg`, 25/25/1): the invariance term sums over coordinates
(lam/n, not lam/(n d)) and the covariance term is normalized by d(d-1), not d.

How the two views enter the covariance. The equation writes one C, built from psi~(a). The two views are
samples of the same marginal, so C(a) and C(a+) estimate the same population covariance; we take each
view's own batch covariance (each view centered by its own batch mean) and AVERAGE the variance and
covariance terms over the two views. This uses both views, is symmetric in (a, a+) like the loss's first
term, and keeps the written scale: with identical views the value is exactly the written equation (the
lightly/FAIR code instead averages the variance terms but sums the covariance terms, i.e. 2 nu).
The invariance term is unaffected by centering when both views are centered by the same mean, as written
(psi~ subtracts one mean), so it is computed on the raw features.

Joint nesting is sum_k w_k L_k(first k coordinates) with L_k's own normalizers mu/k and nu/(k(k-1))
(no pair term for k = 1), folded into O(d^2) masks as for RQ. Statistics are over the global batch: the
per-view means are all-reduced first (O(d)), then the centered Gram matrices (O(d^2)), both through the
autograd-aware all-reduce, so the gradient equals the single-process gradient on the global batch.
"""

from __future__ import annotations

import torch

from eigtrain.objectives.rq import _pair_factor
from eigtrain.objectives.vicreg import VICReg
from eigtrain.schema.objectives import VicregPaperConfig, coefficients_of


class VICRegPaper(VICReg):
    name = "vicreg_paper"
    defaults = coefficients_of(VicregPaperConfig)

    def __init__(self, dim, nesting, distributed=True, pairs=None, **coefficients):
        super().__init__(dim, nesting, distributed, pairs, **coefficients)
        lam, mu, nu = (float(self.coef[k]) for k in ("lam", "mu", "nu"))
        if min(lam, mu, nu) < 0 or float(self.coef["eps"]) <= 0:
            raise ValueError(f"vicreg_paper needs lam, mu, nu >= 0 and eps > 0, got {self.coef}")
        self.register_masks("inv")
        self.register_masks("var", lambda k: mu / k)
        self.register_masks("cov", _pair_factor(nu))

    def combine(self, s, own):
        n, eps = s["n"], float(self.coef["eps"])
        c_inv = self.mask("inv", own, s["diff2"])
        c_var = self.mask("var", own, s["diff2"])
        C_cov = self.mask("cov", own, s["diff2"], matrix=True)
        C_cov = C_cov * (1.0 - torch.eye(self.dim, dtype=C_cov.dtype, device=C_cov.device))

        invariance = self.coef["lam"] * (c_inv * s["diff2"]).sum() / n
        variance = covariance = 0.0
        for p in (s["PF"], s["PG"]):  # one term per view, averaged
            cov = p / (n - 1)
            std = torch.sqrt(torch.diagonal(cov) + eps)
            variance = variance + 0.5 * (c_var * torch.relu(1.0 - std)).sum()
            covariance = covariance + 0.5 * (C_cov * cov.pow(2)).sum()
        loss = invariance + variance + covariance
        return loss, {"invariance": invariance, "variance": variance, "covariance": covariance}
