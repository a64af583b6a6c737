"""VICReg, the widely used parameterization (baseline).

sim_coeff * mse(f, g) + std_coeff * (v(f) + v(g)) / 2 + cov_coeff * (c(f) + c(g)), with
v = mean_i relu(1 - sqrt(var_i + eps)) (unbiased variance) and c = sum_{i != j} C_ij^2 / d (unbiased
covariance C). Statistics are over the global batch: the mean is all-reduced first (O(d)), then the
centered Gram matrices (O(d^2)). Nesting folds the per-prefix 1/k normalizers into masks.
"""

from __future__ import annotations

import torch

from eigtrain.objectives.base import Objective
from eigtrain.objectives.moments import device_scalar, gram
from eigtrain.schema.objectives import VicregConfig, coefficients_of


class VICReg(Objective):
    name = "vicreg"
    defaults = coefficients_of(VicregConfig)

    def __init__(self, dim, nesting, distributed=True, pairs=None, **coefficients):
        super().__init__(dim, nesting, distributed, pairs, **coefficients)
        self.register_masks("mean", lambda k: 1.0 / k)

    def prepare(self, f, g):
        return f, g, (self.global_mean(f), self.global_mean(g))

    def spectrum_features(self, f, g, ctx):
        return f - ctx[0], g - ctx[1]

    def moments(self, f, g, sequential, ctx):
        fc, gc = f - ctx[0], g - ctx[1]
        return {
            "n": device_scalar(len(f), f),
            "diff2": (f - g).pow(2).sum(0),
            "PF": gram(fc, fc, sequential),
            "PG": gram(gc, gc, sequential),
        }

    def combine(self, s, own):
        n, eps = s["n"], float(self.coef["eps"])
        c = self.mask("mean", own, s["diff2"])
        C = self.mask("mean", own, s["diff2"], matrix=True)
        C = C * (1.0 - torch.eye(self.dim, dtype=C.dtype, device=C.device))

        invariance = self.coef["sim_coeff"] * (c * s["diff2"]).sum() / n
        variance = covariance = 0.0
        for p in (s["PF"], s["PG"]):
            cov = p / (n - 1)
            std = torch.sqrt(torch.diagonal(cov) + eps)
            variance = variance + 0.5 * self.coef["std_coeff"] * (c * torch.relu(1.0 - std)).sum()
            covariance = covariance + self.coef["cov_coeff"] * (C * cov.pow(2)).sum()
        loss = invariance + variance + covariance
        return loss, {"invariance": invariance, "variance": variance, "covariance": covariance}
