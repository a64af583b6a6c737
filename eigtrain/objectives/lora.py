"""Low-rank approximation (LoRA) and the spectral contrastive loss (SCL).

L = -2 E_{P+}[f^T g] + E_{P(x)P(a)}[(f^T g')^2]. The second term is the U-statistic over pairs p != q,
  sum_{p != q} (f_p^T g_q)^2 = <F^T F, G^T G>_F - sum_p (f_p^T g_p)^2,
divided by N(N-1): no N x N matrix, cost O(N d^2). With nesting, the per-sample correction becomes
sum_p sum_k u_k (cumsum_k of f_p * g_p)^2, which costs O(N d).

constant_mode='fixed' holds the constant function c = 1 outside the nested prefixes: every prefix loss is
the loss of [1, f_1..f_k] against [1, g_1..g_k]. The constant is the kernel's top eigenfunction (eigenvalue 1)
for any P+, so it is exact, not learned; expanding the square, L([1, f]) = L(f) - 1 + 2 sum_i E[f_i] E[g_i],
the product of means over independent samples (its U-statistic: (sum_p f_p)(sum_q g_q) - sum_p f_p g_p over
N(N-1)), which drives every coordinate towards mean zero. With normalize=full|prefix the constant is appended
after the normalization (it is not a coordinate of f, so it takes no share of the unit norm).
"""

from __future__ import annotations

import torch.nn.functional as F

from eigtrain.objectives.base import Objective
from eigtrain.objectives.moments import device_scalar, gram
from eigtrain.schema.objectives import LoraConfig, coefficients_of

NORMALIZE = ("none", "full", "prefix")
CONSTANT_MODES = ("none", "fixed")


class LoRA(Objective):
    name = "lora"
    # constant_mode: fixed (the constant function held outside the nested prefixes; module docstring) | none.
    defaults = coefficients_of(LoraConfig)
    default_pairs = True

    def __init__(self, dim, nesting, distributed=True, pairs=None, **coefficients):
        super().__init__(dim, nesting, distributed, pairs, **coefficients)
        norm = self.coef["normalize"]
        norm = {True: "full", False: "none"}.get(norm, norm)
        if norm not in NORMALIZE:
            raise ValueError(f"normalize={norm!r} is unknown; allowed: {', '.join(NORMALIZE)} (or true/false)")
        if norm == "prefix" and (nesting.sequential or self.coef["center"]):
            raise ValueError("normalize='prefix' cannot be combined with sequential nesting or center=true")
        if norm == "full" and nesting.sequential:
            # f / ||f|| ties every coordinate to all others, so earlier modes would still move with later
            # prefix losses: not the stop-gradient that sequential nesting promises.
            raise ValueError(
                "normalize='full' cannot be combined with nesting='sequential' (the norm couples all "
                "modes, so it is not a stop-gradient); use nesting='joint' or normalize='none'"
            )
        self.coef["normalize"] = norm
        self.constant = self.coef["constant_mode"]
        if self.constant not in CONSTANT_MODES:
            raise ValueError(f"constant_mode={self.constant!r} is unknown; allowed: {', '.join(CONSTANT_MODES)}")
        if self.constant == "fixed" and self.coef["center"]:
            raise ValueError(
                "constant_mode='fixed' (the default) cannot be combined with center=true (centering "
                "already removes the constant); set constant_mode=none with center=true"
            )
        self.register_masks("pair")
        self.register_buffer("prefix_u", nesting.prefix_factors(), persistent=False)

    def prepare(self, f, g):
        if self.coef["normalize"] == "full":
            f, g = F.normalize(f, dim=1), F.normalize(g, dim=1)
        if self.coef["center"]:
            f, g = self.center(f, g)
        return f, g, None

    def moments(self, f, g, sequential, ctx):
        n = device_scalar(len(f), f)
        if self.coef["normalize"] == "prefix":
            return {"n": n, **self._prefix_normalized_moments(f, g)}
        h = f * g
        cs = h.cumsum(1)
        if sequential:  # in L_k only mode k moves: earlier modes' partial sums are constants
            cs = (cs - h).detach() + h
        u = self.prefix_u.to(f.dtype)
        sums = {"Sf": f.sum(0), "Sg": g.sum(0)} if self.constant == "fixed" else {}
        return {
            "n": n,
            "P": gram(f, f, sequential),
            "Q": gram(g, g, sequential),
            "D": h.sum(0),
            "corr": (cs.pow(2) @ u).sum(),
            **sums,
        }

    def combine(self, s, own):
        if self.coef["normalize"] == "prefix":
            return self._prefix_normalized_loss(s)
        n = s["n"]
        c = self.mask("pair", own, s["D"])
        C = self.mask("pair", own, s["P"], matrix=True)
        align = -2.0 * (c * s["D"]).sum() / n
        uniform = ((C * s["P"] * s["Q"]).sum() - s["corr"]) / (n * (n - 1))
        if self.constant == "fixed":
            const = self._constant_term(c * (s["Sf"] * s["Sg"] - s["D"]), n, sum(self.nesting.weights))
            return align + uniform + const, {"align": align, "uniform": uniform, "constant": const}
        return align + uniform, {"align": align, "uniform": uniform}

    @staticmethod
    def _constant_term(weighted_cross_sums, n, total_weight: float):
        """The fixed constant's share of the nested loss: -sum_k w_k + 2 sum_i c_i E[f_i] E[g_i] (U-statistic)."""
        return 2.0 * weighted_cross_sums.sum() / (n * (n - 1)) - total_weight

    # The paper's joint nesting for SCL normalizes each prefix on its own (features on spheres of
    # different sizes). That cannot be folded into one mask, so it costs sum_{k in K} N k^2: ~1.33x the
    # un-nested loss for the MRL set {4, 8, ..., d}, but O(N d^3) for all prefixes.
    def _prefix_normalized_moments(self, f, g):
        out = {}
        for k in self.nesting.prefixes:
            fk, gk = F.normalize(f[:, :k], dim=1), F.normalize(g[:, :k], dim=1)
            dots = (fk * gk).sum(1)
            out.update({f"P{k}": fk.T @ fk, f"Q{k}": gk.T @ gk, f"D{k}": dots.sum(), f"corr{k}": dots.pow(2).sum()})
            if self.constant == "fixed":
                out.update({f"Sf{k}": fk.sum(0), f"Sg{k}": gk.sum(0)})
        return out

    def _prefix_normalized_loss(self, s):
        n = s["n"]
        align = uniform = 0.0
        for k, w in zip(self.nesting.prefixes, self.nesting.weights):
            align = align - 2.0 * w * s[f"D{k}"] / n
            uniform = uniform + w * ((s[f"P{k}"] * s[f"Q{k}"]).sum() - s[f"corr{k}"]) / (n * (n - 1))
        if self.constant == "fixed":
            cross = sum(
                w * ((s[f"Sf{k}"] * s[f"Sg{k}"]).sum() - s[f"D{k}"])
                for k, w in zip(self.nesting.prefixes, self.nesting.weights)
            )
            const = self._constant_term(cross, n, sum(self.nesting.weights))
            return align + uniform + const, {"align": align, "uniform": uniform, "constant": const}
        return align + uniform, {"align": align, "uniform": uniform}


class SCL(LoRA):
    """Spectral contrastive loss: LoRA with one shared encoder on two views.

    Scale: -2 E[f(a)^T f(a+)] + E[(f(a)^T f(a-))^2], as in HaoChen et al.'s code and the LoRA form. The
    paper writes SCL as -E[.] + 1/2 E[(.)^2] (its eqn. spectral-contrastive-loss), exactly half of this: same
    minimizers and the same gradient direction; only the effective SGD/momentum learning rate is 2x (Adam
    is scale-invariant up to its eps).
    """

    name = "scl"
    default_pairs = False
    allows_pairs = False
