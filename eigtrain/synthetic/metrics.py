"""The paper's metrics (section 5.1): EF-MSE with the sign chosen per function, and EV-RAE."""

import torch


def ef_mse_per_function(psi_true: torch.Tensor, psi_hat: torch.Tensor) -> torch.Tensor:
    """min over s in {+1, -1} of E (psi_i - s psi_hat_i)^2 for each column, from samples (n, d), (n, d)."""
    if psi_true.shape != psi_hat.shape:
        raise ValueError(f"ef_mse: shapes differ, {tuple(psi_true.shape)} vs {tuple(psi_hat.shape)}")
    psi_true, psi_hat = psi_true.double(), psi_hat.double()
    plus = (psi_true - psi_hat).pow(2).mean(0)
    minus = (psi_true + psi_hat).pow(2).mean(0)
    return torch.minimum(plus, minus)


def best_signs(psi_true: torch.Tensor, psi_hat: torch.Tensor) -> torch.Tensor:
    """The sign s_i that minimizes E (psi_i - s_i psi_hat_i)^2, i.e. the sign of <psi_i, psi_hat_i>."""
    inner = (psi_true.double() * psi_hat.double()).mean(0)
    return torch.where(inner < 0, -1.0, 1.0).double()


def ev_rae_per_function(eigenvalues_true: torch.Tensor, eigenvalues_hat: torch.Tensor) -> torch.Tensor:
    """|lambda_i - lambda_hat_i| / lambda_i for each i."""
    if eigenvalues_true.shape != eigenvalues_hat.shape:
        raise ValueError(f"ev_rae: shapes differ, {tuple(eigenvalues_true.shape)} vs {tuple(eigenvalues_hat.shape)}")
    lam = eigenvalues_true.double()
    return (lam - eigenvalues_hat.double()).abs() / lam
