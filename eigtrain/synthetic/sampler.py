"""Exact sampler of P+(a, a'): a uniform on [-1, 1]^p, then a' | a by rejection.

The conditional density of a' given a is k(a, a') times the uniform density, and k <= kernel_bound() <= 2,
so a uniform proposal accepted with probability k(a, a') / bound is exact; on average half the proposals
are accepted whatever a is (the conditional integrates to 1).
"""

import torch

from eigtrain.synthetic.kernels import SyntheticKernel

PROPOSALS_PER_ROW = 4


def sample_uniform(kernel: SyntheticKernel, n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(n, kernel.input_dim, generator=generator, dtype=torch.float64) * 2 - 1


def sample_pairs(kernel: SyntheticKernel, n: int, generator: torch.Generator, dtype=torch.float32):
    """n exact draws (a, a') from P+ -> two (n, p) tensors."""
    a = sample_uniform(kernel, n, generator)
    a_pos = torch.empty_like(a)
    bound = kernel.kernel_bound()
    pending = torch.arange(n)
    while pending.numel():
        # A few proposals per pending row, keep the first accepted one: still exact, and since each is
        # accepted with probability 1/bound >= 1/2, almost every row finishes in the first round.
        m = pending.numel()
        proposal = sample_uniform(kernel, m * PROPOSALS_PER_ROW, generator)
        u = torch.rand(m * PROPOSALS_PER_ROW, generator=generator, dtype=torch.float64)
        weighted_anchor = kernel.eigenfunctions(a[pending]) * kernel.eigenvalues  # (m, r)
        k = torch.einsum("mr,mkr->mk", weighted_anchor, kernel.eigenfunctions(proposal).view(m, PROPOSALS_PER_ROW, -1))
        accepted = u.view(m, PROPOSALS_PER_ROW) * bound < k
        found = accepted.any(dim=1)
        first = accepted.to(torch.int8).argmax(dim=1)
        a_pos[pending[found]] = proposal.view(m, PROPOSALS_PER_ROW, -1)[found, first[found]]
        pending = pending[~found]
    return a.to(dtype), a_pos.to(dtype)
