"""The dense linear algebra of the exact solve (eigtrain.export.rayleigh_ritz): the Gram's Cholesky whitener, the
whitened cross moment, the symmetric eigendecomposition. On the CPU through scipy's LAPACK and numpy's BLAS rather
than torch's: one library's threads for the whole pass (torch's cholesky_solve of one vector took 0.2-0.8 s at
d = 2,048 beside scipy's 0.04 s in the same loaded process; tools/bench_rr_scale.py)."""

from __future__ import annotations

from typing import NamedTuple

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


def cholesky(sym: torch.Tensor) -> torch.Tensor | None:
    """The lower Cholesky factor of the symmetric part of sym, None where it is not positive definite. On the CPU
    LAPACK's potrf through scipy (the pass's other factorizations' library and threads), elsewhere torch's."""
    sym = (sym + sym.T) / 2
    if sym.device.type != "cpu":
        factor, info = torch.linalg.cholesky_ex(sym)
        return factor if int(info) == 0 else None
    from scipy.linalg.lapack import dpotrf

    # sym is symmetric: its transpose, column-major, is factored in place (no copy)
    factor, info = dpotrf(sym.numpy().T, lower=1, clean=1, overwrite_a=1)
    return torch.from_numpy(factor) if info == 0 else None


def cho_solve(factor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """G^-1 x from G's lower Cholesky factor: two triangular solves."""
    if factor.device.type != "cpu":
        return torch.cholesky_solve(x, factor)
    import scipy.linalg

    return torch.from_numpy(scipy.linalg.cho_solve((factor.numpy(), True), x.numpy(), check_finite=False))


WHITENER_MARGIN = 16.0  # the whitener's smallest eigenvalue over rtol * its largest: the range cut's eigh rounds its
# smallest eigenvalues by about rtol * the largest (rtol >= d * eps), the Lanczos estimates are far closer than that


def extreme_eigenvalue(matvec, d: int, device, seed: int = 0) -> float:
    """The largest eigenvalue of the symmetric positive operator `matvec` (torch (d, 1) -> (d, 1)), by Lanczos
    (ARPACK through scipy): converged (residual 1e-4 of the value) in a few dozen products, where power iteration from a
    fixed vector can stall (its start orthogonal to the top eigenvector) and needs a margin for its slack."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    def apply(x):
        y = matvec(torch.from_numpy(x.reshape(d, 1).astype("float64")).to(device))
        return y.cpu().numpy().reshape(-1)

    start = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=F64).numpy()  # deterministic
    (value,) = eigsh(LinearOperator((d, d), matvec=apply, dtype="float64"), k=1, which="LA", v0=start, tol=1e-4,
                     return_eigenvectors=False, ncv=min(d, 24), maxiter=50 * d)  # fmt: skip
    return float(value)


class Whitener(NamedTuple):
    factor: torch.Tensor  # the lower Cholesky factor L of the (ridged) Gram
    smallest: float  # its smallest eigenvalue (Lanczos on G^-1: from above, converged)
    largest: float  # its largest (Lanczos on G: from below, converged)


def cholesky_whitener(gram: torch.Tensor, ridge: float, rtol: float, n: int) -> Whitener | None:
    """The (ridged) Gram's Cholesky factor L (G = L L^T: W = L^-T whitens, W^T G W = I), when the Gram is plainly of
    full rank: the same generalized solve as whitening on the range, for a third of the cost of an
    eigendecomposition, and W is never formed (`whitened`, `unwhitened`: LAPACK's sygst, a triangular solve). None
    (the range's eigendecomposition decides) when the factorization fails or the smallest eigenvalue (Lanczos on
    G^-1 through the factor) is not WHITENER_MARGIN above rtol * the largest (Lanczos on G), or when n pairs could
    not order d dimensions."""
    g = ridged(gram, ridge)
    d = len(g)
    if d >= n:
        return None
    factor = cholesky(g)
    if factor is None:
        return None
    if d <= 2:  # Lanczos needs d > 2: the eigenvalues themselves
        smallest, largest = (float(v) for v in torch.linalg.eigvalsh((g + g.T) / 2)[[0, -1]])
    else:
        smallest = 1 / extreme_eigenvalue(lambda x: cho_solve(factor, x), d, g.device)
        largest = extreme_eigenvalue(lambda x: g @ x, d, g.device)
    if not smallest > WHITENER_MARGIN * rtol * largest:
        return None
    return Whitener(factor, smallest, largest)


def whitened_eigh(cross: torch.Tensor, factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvalues, descending; W y): the generalized eigenpairs of (K, G) from G's lower Cholesky factor L
    (W = L^-T). On the CPU LAPACK's sygst reduces K to L^-1 K L^-T and syevd decomposes it in place, both reading one
    triangle (nothing symmetrized, flipped or copied between them: five d x d passes fewer; sygst is d^3 flops, the
    reduction scipy.linalg.eigh(K, G) makes, where two triangular solves take twice that), then one triangular solve.
    Elsewhere torch's: two triangular solves, eigh, one back."""
    if cross.device.type != "cpu":
        x = torch.linalg.solve_triangular(factor, cross, upper=False)
        values, y = descending_eigh(torch.linalg.solve_triangular(factor, x.T, upper=False))
        return values, torch.linalg.solve_triangular(factor.T, y, upper=True)
    import scipy.linalg
    from scipy.linalg.lapack import dsygst

    # K is symmetric: its transpose, column-major, is a copy away from sygst's layout (no transposing copy)
    reduced, info = dsygst(cross.numpy().T, factor.numpy(), itype=1, lower=1)
    if info != 0:
        raise RuntimeError(f"LAPACK dsygst failed (info {info})")
    values, vectors = scipy.linalg.eigh(reduced, lower=True, driver="evd", overwrite_a=True, check_finite=False)
    transform = scipy.linalg.solve_triangular(
        factor.numpy(), vectors[:, ::-1], trans="T", lower=True, overwrite_b=True, check_finite=False
    )
    return torch.from_numpy(values[::-1].copy()), torch.from_numpy(transform)


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
