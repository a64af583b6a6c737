"""Naive reference implementations of each objective on one prefix, written from the formulas.

They use O(m^2) pair matrices and explicit loops where that is clearer; tests compare the masked,
moment-based objectives against sums of these over prefixes.
"""

import torch
import torch.nn.functional as F


def lora(f, g):
    m = len(f)
    align = -2.0 * (f * g).sum(1).mean()
    s = f @ g.T
    off = s.pow(2) * (1 - torch.eye(m, dtype=f.dtype))
    return align + off.sum() / (m * (m - 1))


def _split_moments(parts_a, parts_b):
    ma = sum(p.T @ p for p in parts_a) / sum(len(p) for p in parts_a)
    mb = sum(p.T @ p for p in parts_b) / sum(len(p) for p in parts_b)
    return ma, mb


def _penalties(ma, mb, m_all, mu, nu):
    d = ma.shape[0]
    var = sum((ma[i, i] * mb[i, i] - 2 * m_all[i, i] + 1) for i in range(d)) * mu / d
    cov = 0.0
    if d > 1:
        cov = sum(ma[i, j] * mb[i, j] for i in range(d) for j in range(d) if i != j) * nu / (d * (d - 1))
    return var + cov


def rq(f, g, mu=10.0, nu=30.0, pairs=False):
    inv = (f - g).pow(2).sum(1).mean()
    if pairs:
        total = inv
        for z in (f, g):
            ma, mb = _split_moments([z[0::2]], [z[1::2]])
            total = total + _penalties(ma, mb, z.T @ z / len(z), mu, nu)
        return total
    ma, mb = _split_moments([f[0::2], g[0::2]], [f[1::2], g[1::2]])
    m_all = (f.T @ f + g.T @ g) / (2 * len(f))
    return inv + _penalties(ma, mb, m_all, mu, nu)


def rq_direct(f, g, mu=10.0, nu=30.0):
    d = f.shape[1]
    inv = (f - g).pow(2).sum(1).mean()
    ma, mb = _split_moments([f[0::2], g[0::2]], [f[1::2], g[1::2]])
    m_all = (f.T @ f + g.T @ g) / (2 * len(f))
    ka = (f[0::2].T @ g[0::2] + g[0::2].T @ f[0::2]) / (2 * len(f[0::2]))
    kb = (f[1::2].T @ g[1::2] + g[1::2].T @ f[1::2]) / (2 * len(f[1::2]))
    var = sum((ma[i, i] * mb[i, i] - 2 * m_all[i, i] + 1) for i in range(d)) * mu / d
    cov = 0.0
    if d > 1:
        cov = sum(ka[i, j] * kb[i, j] for i in range(d) for j in range(d) if i != j) * nu / (d * (d - 1))
    return inv + var + cov


def vicreg(x, y, sim_coeff=25.0, std_coeff=25.0, cov_coeff=1.0, eps=1e-4):
    """As in the official VICReg implementation (single process)."""
    n, d = x.shape
    repr_loss = F.mse_loss(x, y)
    x = x - x.mean(0)
    y = y - y.mean(0)
    std_x = torch.sqrt(x.var(0) + eps)
    std_y = torch.sqrt(y.var(0) + eps)
    std_loss = torch.mean(F.relu(1 - std_x)) / 2 + torch.mean(F.relu(1 - std_y)) / 2
    cov_x = x.T @ x / (n - 1)
    cov_y = y.T @ y / (n - 1)
    off = 1 - torch.eye(d, dtype=x.dtype)
    cov_loss = (cov_x.pow(2) * off).sum() / d + (cov_y.pow(2) * off).sum() / d
    return sim_coeff * repr_loss + std_coeff * std_loss + cov_coeff * cov_loss


def vicreg_paper(f, g, lam=50.0, mu=25.0, nu=512.0, eps=1e-4):
    """The paper's eqn. (appendix G) with loops; variance/covariance terms averaged over the two views."""
    n, d = f.shape
    total = lam * sum(((f[p] - g[p]) ** 2).sum() for p in range(n)) / n
    for z in (f, g):
        zc = z - z.mean(0)
        C = [[sum(zc[p, i] * zc[p, j] for p in range(n)) / (n - 1) for j in range(d)] for i in range(d)]
        var = sum(torch.relu(1 - torch.sqrt(C[i][i] + eps)) for i in range(d)) * mu / d
        cov = sum(C[i][j] ** 2 for i in range(d) for j in range(d) if i != j) * nu / (d * (d - 1)) if d > 1 else 0.0
        total = total + 0.5 * (var + cov)
    return total
