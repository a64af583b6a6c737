"""Encoder for the synthetic kernels: fixed input features, then an MLP (paper appendix G).

Features make the eigenfunctions easy to express: monomials prod_j a_j^(i_j), 0 <= i_j <= r, for Legendre
kernels and cos(i pi a_j), 0 <= i <= r, for Fourier kernels, appended to the raw input a.
"""

import itertools
import math

import torch
from torch import nn


class InputFeatures(nn.Module):
    """[a, extra]: extra = monomials prod_j a_j^(i_j) (legendre), or cos(i pi a_j) per coordinate (fourier,
    the paper), or with fourier_products the tensor products prod_j cos(i_j pi a_j), 0 <= i_j <= rank
    (the Fourier analogue of the paper's monomials)."""

    exponents: torch.Tensor  # buffers: exponents (legendre), or frequencies and orders (fourier)
    frequencies: torch.Tensor
    orders: torch.Tensor

    def __init__(self, kernel_name: str, input_dim: int, rank: int, fourier_products: bool = False):
        super().__init__()
        self.kernel_name = kernel_name
        self.products = kernel_name == "legendre" or fourier_products
        orders = torch.tensor(list(itertools.product(range(rank + 1), repeat=input_dim)))  # (F, p)
        if kernel_name == "legendre":
            self.register_buffer("exponents", orders.float(), persistent=False)
        else:
            self.register_buffer("frequencies", torch.arange(rank + 1).float() * math.pi, persistent=False)
            self.register_buffer("orders", orders, persistent=False)
        extra = orders.shape[0] if self.products else input_dim * (rank + 1)
        self.out_dim = input_dim + extra

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        if self.kernel_name == "legendre":
            extra = torch.pow(a.unsqueeze(1), self.exponents).prod(dim=-1)  # integer exponents: negative bases are fine
        else:
            cosines = torch.cos(a.unsqueeze(-1) * self.frequencies)  # (n, p, rank + 1)
            if self.products:
                coords = torch.arange(a.shape[1], device=a.device)
                extra = cosines[:, coords, self.orders].prod(dim=-1)  # (n, F)
            else:
                extra = cosines.flatten(1)
        return torch.cat([a, extra], dim=1)


class SyntheticEncoder(nn.Module):
    """features -> depth x (Linear(width) + GELU) -> Linear(out_dim).

    fixed_constant: output 1 as coordinate 0 and learn only the other out_dim - 1. The constant function
    is the top eigenfunction (eigenvalue 1) of every kernel P+(a, a') / (P(a) P(a')), so this spends no
    capacity or gradient noise on it; the objectives then act on the rest (e.g. LoRA on (1, h) is LoRA on
    h plus 2 |E h|^2, which keeps h orthogonal to the constant).
    """

    def __init__(
        self,
        kernel_name: str,
        input_dim: int,
        rank: int,
        out_dim: int,
        width: int = 128,
        depth: int = 4,
        fixed_constant: bool = False,
        fourier_products: bool = False,
    ):
        super().__init__()
        self.features = InputFeatures(kernel_name, input_dim, rank, fourier_products)
        self.fixed_constant = fixed_constant
        layers, d = [], self.features.out_dim
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.GELU()]
            d = width
        layers.append(nn.Linear(d, out_dim - 1 if fixed_constant else out_dim))
        self.mlp = nn.Sequential(*layers)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        z = self.mlp(self.features(a))
        if self.fixed_constant:
            z = torch.cat([torch.ones_like(z[:, :1]), z], dim=1)
        return z
