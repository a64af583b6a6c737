"""The dense linear algebra of the exact solve (eigtrain.export.rayleigh_ritz): the Gram's Cholesky whitener, the
whitened cross moment, the symmetric eigendecomposition. On the CPU through scipy's LAPACK and numpy's BLAS rather
than torch's: one library's threads for the whole pass (torch's cholesky_solve of one vector took 0.2-0.8 s at
d = 2,048 beside scipy's 0.04 s in the same loaded process; tools/bench_rr_scale.py)."""

from __future__ import annotations

import torch

F64 = torch.float64


def ridged(gram: torch.Tensor, ridge: float) -> torch.Tensor:
    """G + ridge * (mean eigenvalue of G) * I."""
    if ridge < 0:
        raise ValueError(f"ridge must be >= 0, got {ridge}")
    if ridge == 0:
        return gram
    d = gram.shape[0]
    return gram + ridge * (torch.trace(gram) / d) * torch.eye(d, dtype=F64, device=gram.device)


def cho_solve(factor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """G^-1 x from G's lower Cholesky factor: two triangular solves."""
    if factor.device.type != "cpu":
        return torch.cholesky_solve(x, factor)
    import scipy.linalg

    return torch.from_numpy(scipy.linalg.cho_solve((factor.numpy(), True), x.numpy(), check_finite=False))


def cholesky_whitener(gram: torch.Tensor, ridge: float, rtol: float, n: int) -> torch.Tensor | None:
    """The (ridged) Gram's Cholesky factor L (G = L L^T: W = L^-T whitens, W^T G W = I), when the Gram is plainly of
    full rank: the same generalized solve as whitening on the range, for a third of the cost of an
    eigendecomposition, and W is never formed (`whitened`, `unwhitened`: triangular solves). None
    (the range's eigendecomposition decides) when the factorization fails or the smallest eigenvalue, estimated
    by inverse iteration, is not far above rtol * the largest (or when n pairs could not order d dimensions)."""
    g = ridged(gram, ridge)
    d = len(g)
    if d >= n:
        return None
    factor, info = torch.linalg.cholesky_ex((g + g.T) / 2)
    if int(info) != 0:
        return None
    x = torch.ones(d, 1, dtype=F64, device=g.device) / d**0.5
    for _ in range(6):  # inverse iteration: any direction of (near) rank deficiency dominates after one step
        x = cho_solve(factor, x)
        x = x / x.norm()
    smallest = float((x.T @ g @ x).squeeze())  # an upper bound of the smallest eigenvalue, tight when it stands out
    y = torch.ones(d, 1, dtype=F64, device=g.device) / d**0.5
    for _ in range(10):  # power iteration: a lower bound of the largest eigenvalue, tight within a few steps
        y = g @ y
        y = y / y.norm()
    largest = float((y.T @ g @ y).squeeze())
    if not smallest > 1e3 * rtol * largest:  # a wide margin over the range's own cut (rtol * the largest)
        return None
    return factor


def whitened(cross: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """W^T K W = L^-1 K L^-T for symmetric K: two triangular solves (BLAS trsm), where forming W = L^-T and two
    products would cost twice the flops."""
    if cross.device.type != "cpu":
        x = torch.linalg.solve_triangular(factor, cross, upper=False)
        return torch.linalg.solve_triangular(factor, x.T, upper=False)
    from scipy.linalg import solve_triangular

    lower = factor.numpy()
    x = solve_triangular(lower, cross.numpy(), lower=True, check_finite=False)  # L^-1 K
    return torch.from_numpy(solve_triangular(lower, x.T, lower=True, check_finite=False))  # L^-1 (K L^-T)


def unwhitened(factor: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """W y = L^-T y: one triangular solve."""
    if y.device.type != "cpu":
        return torch.linalg.solve_triangular(factor.T, y, upper=True)
    from scipy.linalg import solve_triangular

    return torch.from_numpy(solve_triangular(factor.numpy(), y.numpy(), trans="T", lower=True, check_finite=False))


def descending_eigh(sym: torch.Tensor):
    sym = (sym + sym.T) / 2
    if sym.device.type != "cpu":
        evals, evecs = torch.linalg.eigh(sym)
        return evals.flip(0), evecs.flip(1)
    import scipy.linalg

    # On the CPU the LAPACK of numpy/scipy (the moments' BLAS) rather than torch's: one library's threads for the whole
    # pass (tools/bench_rr_scale.py; torch's eigh took 4.8 s at d = 512 on its first call in a loaded process)
    evals, evecs = scipy.linalg.eigh(sym.numpy(), driver="evd", overwrite_a=True, check_finite=False)
    return torch.from_numpy(evals).flip(0), torch.from_numpy(evecs).flip(1)
