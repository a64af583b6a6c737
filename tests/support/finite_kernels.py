"""Data whose answer is known exactly: pairs from a finite symmetric joint (its kernel's eigenfunctions computed
directly) for the Rayleigh-Ritz tests, and Gaussian blobs whose class lives in the first coordinates for the probes."""

import numpy as np
import torch


def symmetric_pairs(states=7, n=4000, seed=0):
    """Pairs (a, a') from a random symmetric joint, each drawn pair added in both orders, so the
    empirical joint is symmetric and its kernel is known exactly (it is the data's own kernel)."""
    rng = np.random.default_rng(seed)
    w = rng.random((states, states)) ** 3 + np.eye(states) * 2.0
    p = (w + w.T) / (w + w.T).sum()
    idx = rng.choice(states * states, size=n, p=p.ravel())
    a, b = idx // states, idx % states
    return np.concatenate([a, b]), np.concatenate([b, a])


def empirical_eigenfunctions(a, b, states):
    """Eigenvalues (descending) and eigenfunctions psi[state, i] of the empirical kernel, orthonormal in L2(p)."""
    joint = np.zeros((states, states))
    np.add.at(joint, (a, b), 1.0)
    joint /= joint.sum()
    p = joint.sum(1)
    bmat = joint / np.sqrt(np.outer(p, p))
    lam, u = np.linalg.eigh(bmat)
    order = np.argsort(lam)[::-1]
    return lam[order], u[:, order] / np.sqrt(p)[:, None]


def stream(acc, z1, z2, batch=333):
    for s in range(0, len(z1), batch):
        acc.update(z1[s : s + batch], z2[s : s + batch])
    return acc


def assert_same_functions(got, want, atol):
    """Columns equal up to one sign per column."""
    signs = np.sign((got * want).sum(0))
    np.testing.assert_allclose(got * signs, want, atol=atol)


def blobs(n=600, d=16, informative=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, d, generator=gen)
    x[:, :informative] += 3.0 * torch.nn.functional.one_hot(y, 4).float()  # only the first coordinates carry the class
    return x, y
