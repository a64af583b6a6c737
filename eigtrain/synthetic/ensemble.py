"""M independent synthetic encoders trained as one batched ensemble (grouped matmuls).

Every member has its own weights (initialized exactly as a single SyntheticEncoder under
torch.manual_seed(seed)), its own objective and its own Adam state and step count; members with the same
seed share the same training batches (the same PairStream a single run of that seed draws). The MLP is
one torch.baddbmm per layer over all members, so M runs cost one process, one Python loop and large
matmuls instead of M processes. Member m is the single run of its config up to matmul rounding
(tests/synthetic/test_synthetic_ensemble.py).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eigtrain.synthetic.model import SyntheticEncoder


class EnsembleEncoder(nn.Module):
    """Stacked copies of SyntheticEncoder's MLP: weight l is (M, in, out), bias l is (M, 1, out)."""

    def __init__(self, encoders: list[SyntheticEncoder]):
        super().__init__()
        first = encoders[0]
        self.features, self.fixed_constant = first.features, first.fixed_constant
        linears = [[m for m in e.mlp if isinstance(m, nn.Linear)] for e in encoders]
        shapes = {tuple(tuple(layer.weight.shape) for layer in ls) for ls in linears}
        if len(shapes) != 1 or len({e.fixed_constant for e in encoders}) != 1:
            raise ValueError("ensemble members must share one architecture (features, width, depth, constant mode)")
        self.weights = nn.ParameterList(
            [
                nn.Parameter(torch.stack([ls[i].weight.detach().T for ls in linears]).contiguous())
                for i in range(len(linears[0]))
            ]
        )
        self.biases = nn.ParameterList(
            [
                nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]).unsqueeze(1).contiguous())
                for i in range(len(linears[0]))
            ]
        )
        self.members = len(encoders)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        """a: (M, n, p) inputs, one batch per member -> (M, n, d)."""
        m, n, _ = a.shape
        h = self.features(a.reshape(m * n, -1)).view(m, n, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < last:
                h = F.gelu(h)
        if self.fixed_constant:
            h = torch.cat([torch.ones_like(h[..., :1]), h], dim=-1)
        return h

    def member(self, index: int) -> "MemberEncoder":
        return MemberEncoder(self, index)


class MemberEncoder(nn.Module):
    """One member as an ordinary encoder a (n, p) -> (n, d), for extraction and evaluation."""

    def __init__(self, ensemble: EnsembleEncoder, index: int):
        super().__init__()
        self.ensemble, self.index = ensemble, index

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        ens, i = self.ensemble, self.index
        h = ens.features(a)
        last = len(ens.weights) - 1
        for k, (w, b) in enumerate(zip(ens.weights, ens.biases)):
            h = torch.addmm(b[i], h, w[i])
            if k < last:
                h = F.gelu(h)
        if ens.fixed_constant:
            h = torch.cat([torch.ones_like(h[:, :1]), h], dim=1)
        return h


class MemberAdam:
    """Adam (torch's single-tensor arithmetic, default betas/eps) with a step count per member, so that a
    member whose step is skipped (non-finite loss or gradient) is left exactly as a single run leaves it."""

    def __init__(self, params: Sequence[torch.Tensor], members: int, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.betas, self.eps = params, betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = torch.zeros(members, dtype=torch.float64)

    @torch.no_grad()
    def step(self, lr: float, active: torch.Tensor) -> None:
        """active: (M,) bool, members that take this step."""
        beta1, beta2 = self.betas
        self.steps += active.double()
        t = self.steps.clamp_min(1)
        bias1 = 1 - beta1**t
        bias2_sqrt = (1 - beta2**t).sqrt()
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            shape = (-1,) + (1,) * (p.ndim - 1)
            keep = active.view(shape)
            assert p.grad is not None  # the step follows the backward pass
            g = torch.where(keep, p.grad, torch.zeros((), dtype=p.dtype))
            new_m = m.lerp(g, 1 - beta1)
            new_v = v.mul(beta2).addcmul_(g, g, value=1 - beta2)
            step_size = (lr / bias1).to(p.dtype).view(shape)
            denom = (new_v.sqrt() / bias2_sqrt.to(p.dtype).view(shape)).add_(self.eps)
            new_p = p - step_size * (new_m / denom)
            m.copy_(torch.where(keep, new_m, m))
            v.copy_(torch.where(keep, new_v, v))
            p.copy_(torch.where(keep, new_p, p))
