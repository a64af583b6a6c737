"""Unbiasedness: averaged over many small batches, the batch losses converge to the population loss of a
Gaussian pair distribution with known moments; the naive (biased) estimators measurably do not.

Tolerance: |mean of batch estimates - population| < 4 standard errors of that mean (the naive
estimators miss by far more than that at batch size 4, which is what makes the check able to fail).
"""

import pytest
import torch

from eigtrain.objectives import build_objective

D, BATCH, BATCHES = 3, 4, 6000
F64 = torch.float64


def _gaussian_pairs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(D, D, generator=gen, dtype=F64) * 0.6
    b = a + 0.3 * torch.randn(D, D, generator=gen, dtype=F64)
    c = 0.4 * torch.randn(D, D, generator=gen, dtype=F64)
    m = 0.5 * torch.randn(D, generator=gen, dtype=F64)
    u = torch.randn(BATCHES, BATCH, D, generator=gen, dtype=F64)
    v = torch.randn(BATCHES, BATCH, D, generator=gen, dtype=F64)
    f, g = u @ a.T + m, u @ b.T + v @ c.T + m  # f = A u + m, g = B u + C v + m
    moments = {
        "ff": a @ a.T + torch.outer(m, m),
        "gg": b @ b.T + c @ c.T + torch.outer(m, m),
        "fg": a @ b.T + torch.outer(m, m),
    }
    return f, g, moments


def _population(name, mom, prefixes, mu=10.0, nu=30.0):
    total = 0.0
    for k in prefixes:
        ff, gg, fg = (mom[key][:k, :k] for key in ("ff", "gg", "fg"))
        w = 1.0 / len(prefixes)
        if name == "lora":
            total += w * (-2 * torch.trace(fg) + (ff * gg).sum())
        else:
            pooled = (ff + gg) / 2
            off = 1 - torch.eye(k, dtype=F64)
            second = pooled if name == "rq" else (fg + fg.T) / 2
            inv = torch.trace(ff) + torch.trace(gg) - 2 * torch.trace(fg)
            var = mu / k * ((torch.diagonal(pooled) - 1) ** 2).sum()
            cov = nu / (k * (k - 1)) * (second.pow(2) * off).sum() if k > 1 else 0.0
            total += w * (inv + var + cov)
    return float(total)


def _naive_lora(f, g):
    """Biased: the second moment over all pairs, including p == q."""
    return -2 * (f * g).sum(1).mean() + (f @ g.T).pow(2).mean()


def _naive_rq(f, g, mu=10.0, nu=30.0):
    """Biased: squares of full-batch moments instead of split-batch products."""
    m = (f.T @ f + g.T @ g) / (2 * len(f))
    off = 1 - torch.eye(D, dtype=F64)
    return (
        (f - g).pow(2).sum(1).mean()
        + mu / D * ((torch.diagonal(m) - 1) ** 2).sum()
        + nu / (D * (D - 1)) * (m.pow(2) * off).sum()
    )


@pytest.mark.parametrize(
    "name, nesting, naive",
    [
        ("lora", "none", _naive_lora),
        ("lora", "joint", None),
        ("rq", "none", _naive_rq),
        ("rq", "joint", None),
        ("rq_direct", "none", None),
    ],
)
def test_batch_estimates_are_unbiased(name, nesting, naive):
    f, g, mom = _gaussian_pairs()
    coefficients = {"constant_mode": "none"} if name == "lora" else {}  # _population: LoRA without the constant
    objective = build_objective(name, D, nesting=nesting, distributed=False, **coefficients)
    estimates = torch.stack([objective(f[i], g[i])[0] for i in range(BATCHES)])
    prefixes = range(1, D + 1) if nesting == "joint" else [D]
    population = _population(name, mom, list(prefixes))
    stderr = estimates.std() / BATCHES**0.5
    assert abs(estimates.mean().item() - population) < 4 * stderr.item(), (
        estimates.mean().item(),
        population,
        stderr.item(),
    )
    if naive is not None:  # the check has teeth: the biased estimator fails it
        biased = torch.stack([naive(f[i], g[i]) for i in range(BATCHES)])
        assert abs(biased.mean().item() - population) > 8 * (biased.std() / BATCHES**0.5).item()
