"""Eigenpairs from a trained encoder and their errors against the kernel's true ones.

Five extractions from the same pair moments, reported side by side for every run:
  ordered_paper  - the paper's joint-nesting read-off: features as they are, with the eigenvalue its theory
                   gives: ||f_i||^2 for LoRA/SCL (minimizers sqrt(lambda_i) psi_i), E[f_i(a) f_i(a')] for RQ
                   and VICReg (minimizers of unit norm, eigenvalue = Rayleigh quotient)
  ordered        - features read off in order (joint nesting), each scaled to unit norm, with the
                   Rayleigh quotient E[f_i(a) f_i(a')] / E[f_i^2] as eigenvalue (less noisy than norms)
  ordered_gs     - the same after Gram-Schmidt in feature order (function i keeps only what is
                   orthogonal to functions < i: still ordered, and removes a mean-invariant objective's
                   arbitrary offsets, e.g. VICReg's)
  rr_generalized - Rayleigh-Ritz K y = lambda G y, exact in any basis of the right span
  rr_paper       - the paper's appendix F algorithm for the objective (F.1 RQ, F.2 VICReg, F.3 SCL)

VICReg's loss sees only centered features (the paper's "centered encoder" psi~, and F.2 subtracts the mean),
so it cannot represent the constant psi_1 = 1, the top eigenfunction of every positive-pair kernel: its
features estimate the top-d eigenpairs of the centered kernel, psi_2..psi_{d+1} (target_first = 1), and
every extraction of a VICReg run works on centered features. benchmarks/synthetic.md gives the reading.
"""

from dataclasses import dataclass
from typing import Any

import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.rayleigh_ritz import solve
from eigtrain.synthetic.config import MEAN_INVARIANT  # noqa: F401  (losses of centered features only)
from eigtrain.synthetic.kernels import SyntheticKernel
from eigtrain.synthetic.metrics import best_signs, ef_mse_per_function, ev_rae_per_function
from eigtrain.synthetic.sampler import sample_pairs, sample_uniform

PAPER_RR_MODE = {
    "lora": "paper-lora",
    "scl": "paper-lora",
    "rq": "paper-rq",
    "rq_direct": "paper-rq",
    "vicreg": "paper-vicreg",
    "vicreg_paper": "paper-vicreg",
}
LOW_RANK = ("lora", "scl")
CHUNK = 50_000
CURVE_POINTS = 201


@dataclass
class Extracted:
    eigenvalues: torch.Tensor  # (d,) float64, matched to the true eigenvalues by position
    transform: torch.Tensor  # (d, d) float64: column i gives estimated eigenfunction i
    mean: torch.Tensor  # (d,) float64, subtracted first

    def apply(self, z: torch.Tensor) -> torch.Tensor:
        return (z.double() - self.mean) @ self.transform


@torch.no_grad()
def encode(encoder, a: torch.Tensor) -> torch.Tensor:
    return torch.cat([encoder(chunk) for chunk in a.split(CHUNK)]).double()


@torch.no_grad()
def accumulate_pairs(
    encoder, kernel: SyntheticKernel, n: int, gen: torch.Generator, acc: RRAccumulator
) -> RRAccumulator:
    """Add n fresh P+ pairs encoded by encoder to acc."""
    for start in range(0, n, CHUNK):
        a, a_pos = sample_pairs(kernel, min(CHUNK, n - start), gen)
        acc.update(encode(encoder, a), encode(encoder, a_pos))
    return acc


def target_first(objective: str) -> int:
    """Index of the first true eigenpair an objective's features estimate: 1 (psi_2) for VICReg, else 0."""
    return 1 if objective in MEAN_INVARIANT else 0


def read_off_ordered(acc: RRAccumulator, center: bool = False) -> Extracted:
    """Joint nesting's estimate: feature i is eigenfunction i; eigenvalue = its Rayleigh quotient."""
    gff, ggg, kfg, mean, _ = acc.second_moments(center)
    norms = (torch.diagonal(gff) + torch.diagonal(ggg)) / 2  # both views sample the same marginal
    return Extracted(torch.diagonal(kfg) / norms, torch.diag(norms.rsqrt()), mean)


def read_off_paper(acc: RRAccumulator, objective: str) -> Extracted:
    """The paper's plain read-off: feature i as eigenfunction i, eigenvalue from the objective's theory."""
    gff, ggg, kfg, mean, _ = acc.second_moments(center=objective in MEAN_INVARIANT)
    norms = (torch.diagonal(gff) + torch.diagonal(ggg)) / 2
    eigenvalues = norms if objective in LOW_RANK else torch.diagonal(kfg)
    return Extracted(eigenvalues, torch.eye(len(norms), dtype=norms.dtype), mean)


def read_off_orthogonalized(acc: RRAccumulator, center: bool = False) -> Extracted:
    """Gram-Schmidt in feature order: with G = L L^T (Cholesky), the functions f L^-T are orthonormal
    and function i depends on features 1..i only."""
    gff, ggg, kfg, mean, _ = acc.second_moments(center)
    gram, cross = (gff + ggg) / 2, (kfg + kfg.T) / 2
    inv_lower = torch.linalg.inv(torch.linalg.cholesky(gram))
    transform = inv_lower.T
    eigenvalues = torch.diagonal(inv_lower @ cross @ transform)
    return Extracted(eigenvalues, transform, mean)


def rayleigh_ritz(acc: RRAccumulator, mode: str, center: bool = False) -> Extracted:
    result = solve(acc, mode=mode, center=center, trivial="keep")  # the synthetic kernels' psi_1 = 1 is a target
    return Extracted(result.eigenvalues.double(), result.transform.double(), result.mean.double())


def extract_all(acc: RRAccumulator, objective: str) -> dict[str, Extracted]:
    center = objective in MEAN_INVARIANT
    return {
        "ordered_paper": read_off_paper(acc, objective),
        "ordered": read_off_ordered(acc, center),
        "ordered_gs": read_off_orthogonalized(acc, center),
        "rr_generalized": rayleigh_ritz(acc, "generalized", center),
        "rr_paper": rayleigh_ritz(acc, PAPER_RR_MODE[objective], center),
    }


def rounded(values: torch.Tensor) -> list:
    """Curves are for plots only: 4 decimals keep the JSON files small."""
    return torch.round(values, decimals=4).tolist()


@torch.no_grad()
def evaluate(
    encoder, kernel: SyntheticKernel, extracted: dict[str, Extracted], n: int, gen: torch.Generator, first: int = 0
) -> dict:
    """EF-MSE and EV-RAE (per function and averaged) of each extraction on n fresh a ~ uniform, against
    the true eigenpairs first .. first + d - 1 (0-based).

    Each estimated function is scaled to unit norm on the evaluation sample (an eigenfunction has unit
    norm; this uses no knowledge of the true function) and its sign is chosen per function.
    """
    a = sample_uniform(kernel, n, gen)
    z = encode(encoder, a.float())
    d = z.shape[1]
    if first + d > kernel.rank:
        raise ValueError(f"evaluate: eigenpairs {first + 1}..{first + d} asked of a rank-{kernel.rank} kernel")
    target = slice(first, first + d)
    psi_true = kernel.eigenfunctions(a)[:, target]
    grid = torch.linspace(-1, 1, CURVE_POINTS, dtype=torch.float64).unsqueeze(1).expand(-1, kernel.input_dim)
    z_grid = encode(encoder, grid.float())
    psi_grid = kernel.eigenfunctions(grid)
    out: dict[str, Any] = {
        "curve_grid": rounded(grid[:, 0]),
        "curve_true": rounded(psi_grid[:, target].T),
        "curve_true_top": rounded(psi_grid[:, :d].T),
    }
    for name, ex in extracted.items():
        psi_hat = ex.apply(z)
        norm = psi_hat.pow(2).mean(0).sqrt().clamp_min(1e-12)
        psi_hat = psi_hat / norm
        ef = ef_mse_per_function(psi_true, psi_hat)
        ev = ev_rae_per_function(kernel.eigenvalues[target], ex.eigenvalues[:d])
        signs = best_signs(psi_true, psi_hat)
        out[name] = {
            "ef_mse": ef.mean().item(),
            "ev_rae": ev.mean().item(),
            "ef_mse_per_function": ef.tolist(),
            "ev_rae_per_function": ev.tolist(),
            "eigenvalues": ex.eigenvalues[:d].tolist(),
            "curve": rounded((ex.apply(z_grid) / norm * signs).T),
        }
    return out
