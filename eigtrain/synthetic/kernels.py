"""Synthetic kernels with known eigenpairs (paper appendix G).

On [-1, 1]^p with the uniform marginal, k(a, a') = sum_{i<=r} lambda_i psi_i(a) psi_i(a') with
  Legendre: psi_i(a) = prod_j sqrt(2i-1) P_{i-1}(a_j)
  Fourier:  psi_i(a) = prod_j sqrt(2) cos((i-1) pi a_j), and psi_1 = 1 exactly
and, as a second reading of the paper's Fourier inputs (benchmarks/synthetic.md), the additive
  fourier_sum: psi_i(a) = p^(-1/2) sum_j sqrt(2) cos((i-1) pi a_j), psi_1 = 1,
all orthonormal under the uniform law, so P+(a, a') = k(a, a') / 4^p is a joint density with uniform marginals
whenever k >= 0. The paper's sufficient condition (its Proposition in appendix G) bounds the negative part
by sup|psi_i|^2: sum_{i>=2} lambda_i sup|psi_i|^2 <= 1, with sup|psi_i|^2 = (2i-1)^p (Legendre), 2^p (Fourier).
"""

import math
from dataclasses import dataclass

import torch

from eigtrain.synthetic.config import KERNELS  # noqa: F401  (the names, checked before torch)

PAPER_INPUT_DIM = {"legendre": 1, "fourier": 2, "fourier_sum": 2}


@dataclass(frozen=True)
class SyntheticKernel:
    name: str
    input_dim: int
    eigenvalues: torch.Tensor  # (rank,) float64, descending, eigenvalues[0] = 1 for the constant mode

    @property
    def rank(self) -> int:
        return self.eigenvalues.numel()

    def eigenfunctions(self, a: torch.Tensor) -> torch.Tensor:
        """psi_1..psi_r at points a (n, p) -> (n, r), in a's dtype."""
        x = a.unsqueeze(-1).double()  # (n, p, 1); float64 so that high orders stay accurate
        order = torch.arange(self.rank, device=a.device, dtype=torch.float64)
        if self.name == "legendre":
            per_coord = torch.special.legendre_polynomial_p(x, order) * torch.sqrt(2 * order + 1.0)
        else:
            per_coord = math.sqrt(2) * torch.cos(order * math.pi * x)
            per_coord[..., 0] = 1.0  # sqrt(2) cos(0) would make psi_1 = 2^(p/2); the constant mode is 1
            if self.name == "fourier_sum":
                summed = per_coord.sum(dim=1) / math.sqrt(a.shape[1])
                summed[:, 0] = 1.0  # the constant mode is exactly 1
                return summed.to(a.dtype)
        return per_coord.prod(dim=1).to(a.dtype)

    def kernel(self, a: torch.Tensor, a_pos: torch.Tensor) -> torch.Tensor:
        """k(a, a') for paired rows (n, p), (n, p) -> (n,)."""
        lam = self.eigenvalues.to(a.dtype).to(a.device)
        return (self.eigenfunctions(a) * self.eigenfunctions(a_pos) * lam).sum(-1)

    def kernel_bound(self) -> float:
        """An upper bound of k on [-1, 1]^p (at most 2 when the validity condition holds)."""
        return 1.0 + float((self.eigenvalues[1:] * sup_squared(self.name, self.rank, self.input_dim)[1:]).sum())


def sup_squared(name: str, rank: int, input_dim: int) -> torch.Tensor:
    """sup_a psi_i(a)^2 for i = 1..rank, the weights of the validity condition."""
    i = torch.arange(1, rank + 1, dtype=torch.float64)
    if name == "fourier_sum":  # (p sqrt(2) / sqrt(p))^2 = 2p
        sup = torch.full_like(i, 2.0 * input_dim)
        sup[0] = 1.0
        return sup
    per_coord = 2 * i - 1 if name == "legendre" else torch.full_like(i, 2.0)
    sup = per_coord**input_dim
    sup[0] = 1.0
    return sup


def check_validity(name: str, eigenvalues: torch.Tensor, input_dim: int) -> None:
    """Raise ValueError unless eigenvalues make P+ a density by the paper's sufficient condition."""
    lam = eigenvalues.to(torch.float64)
    if lam.ndim != 1 or lam.numel() < 2:
        raise ValueError(f"synthetic kernel: need at least 2 eigenvalues, got shape {tuple(lam.shape)}")
    if lam[0] != 1.0:
        raise ValueError(
            f"synthetic kernel: eigenvalue of the constant mode must be 1 (P+ has uniform marginals), got {lam[0].item()}"
        )
    if (lam[1:] <= 0).any() or (lam[1:].diff() > 0).any() or lam[1] > 1:
        raise ValueError(f"synthetic kernel: eigenvalues must be positive and non-increasing, got {lam.tolist()}")
    total = float((lam[1:] * sup_squared(name, lam.numel(), input_dim)[1:]).sum())
    if total > 1 + 1e-12:
        raise ValueError(
            f"synthetic kernel '{name}' (p={input_dim}, rank={lam.numel()}) violates the validity condition: "
            f"sum_(i>=2) lambda_i sup|psi_i|^2 = {total:.4f} > 1, so P+(a, a') may be negative; shrink the eigenvalues"
        )


def paper_eigenvalues(name: str, rank: int, input_dim: int, decay: float = 0.3) -> torch.Tensor:
    """lambda_1 = 1, lambda_i = c exp(-decay i) for i >= 2 with c the largest value meeting the validity condition."""
    i = torch.arange(2, rank + 1, dtype=torch.float64)
    shape = torch.exp(-decay * i)
    c = 1.0 / float((shape * sup_squared(name, rank, input_dim)[1:]).sum())
    return torch.cat([torch.ones(1, dtype=torch.float64), c * shape])


def build_kernel(name: str, rank: int, input_dim: int | None = None, eigenvalues=None) -> SyntheticKernel:
    if name not in KERNELS:
        raise ValueError(f"kernel={name!r} is not allowed; allowed: {', '.join(KERNELS)}")
    if rank < 2:
        raise ValueError(f"rank={rank}: a synthetic kernel needs rank >= 2")
    input_dim = PAPER_INPUT_DIM[name] if input_dim is None else input_dim
    if input_dim < 1:
        raise ValueError(f"input_dim={input_dim}: must be >= 1")
    if eigenvalues is None:
        lam = paper_eigenvalues(name, rank, input_dim)
    else:
        lam = torch.as_tensor(eigenvalues, dtype=torch.float64)
        if lam.numel() != rank:
            raise ValueError(f"synthetic kernel: {lam.numel()} eigenvalues given for rank={rank}")
    check_validity(name, lam, input_dim)
    return SyntheticKernel(name, input_dim, lam)
