"""The paper's convention (Rayleigh-Ritz on the raw span, the constant kept) from the export's centered generalized
solve, without a second factorization or eigendecomposition (docs/export.md, "The pass at scale").

With T the centered solve's full-rank transform (T^T G_c T = I, T^T K_c T = diag(Lambda)) and mu the pooled mean,
the functions 1 and psi = (z - mu) T are orthonormal under the data, and the kernel there is diag(1, Lambda): the
constant is an eigenfunction (eigenvalue 1) orthogonal to every centered function. A raw function z w (w = T c) is
psi c + mu^T T c: the raw span is the complement, in these coordinates, of u = (1, -T^T mu). Rayleigh-Ritz on it is
the eigenproblem of D = diag(1, Lambda) restricted to u's complement: its eigenvalues are the d roots of the secular
equation sum_i u_i^2 / (D_i - lambda) = 0, one between each two poles (LAPACK's dlaed4, the divide-and-conquer
eigensolver's root finder, for D + rho u u^T with rho -> infinity), its eigenvectors (D - lambda)^-1 u with u
recomputed from the roots (Gu and Eisenstat: orthogonal to working precision). O(d^2) and one product T Y.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.rayleigh_ritz import RRResult, fix_signs

EPS = float(np.finfo(np.float64).eps)
RHO = 1e100  # the rank-one update's weight: 1/RHO vanishes beside the secular function (the restriction's limit)


def _dlaed4():
    """LAPACK dlaed4 from scipy's exported LAPACK (scipy.linalg.cython_lapack), callable through ctypes."""
    from scipy.linalg.cython_lapack import __pyx_capi__ as capi

    capsule = capi["dlaed4"]
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    pointer = api.PyCapsule_GetPointer(capsule, api.PyCapsule_GetName(capsule))
    int_p, dbl_p = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_double)
    kind = ctypes.CFUNCTYPE(None, int_p, int_p, dbl_p, dbl_p, dbl_p, dbl_p, dbl_p, int_p)
    return kind(pointer)


def restricted_eigh(poles: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(ascending eigenvalues, eigenvectors as columns) of diag(poles) restricted to the complement of u: the
    len(poles) - 1 roots of the secular equation and their unit vectors (orthogonal to u). None when two poles
    that u touches lie within rounding of each other (no strict interlacing: the caller solves another way)."""
    order = np.argsort(poles, kind="stable")
    d_sorted, z = poles[order].astype(np.float64), u[order].astype(np.float64)
    z = z / np.linalg.norm(z)
    scale = max(float(np.abs(d_sorted).max()), 1.0)
    live = np.abs(z) > 8 * EPS  # deflated: z_i at rounding, e_i is an eigenvector with eigenvalue D_i
    if live.sum() < 1 or np.any(np.diff(d_sorted[live]) <= 8 * EPS * scale):
        return None
    dl, zl = np.ascontiguousarray(d_sorted[live]), z[live] / np.linalg.norm(z[live])
    m = len(dl)
    roots, delta = np.empty(m - 1), np.empty((m - 1, m))  # delta[j]: D - root_j, accurate near each pole
    call, n_c, info = _dlaed4(), ctypes.c_int(m), ctypes.c_int(0)
    rho, lam = ctypes.c_double(RHO), ctypes.c_double(0.0)
    as_p = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))  # noqa: E731
    row = np.empty(m)
    for j in range(m - 1):
        call(ctypes.byref(n_c), ctypes.byref(ctypes.c_int(j + 1)), as_p(dl), as_p(zl), as_p(row), ctypes.byref(rho),
             ctypes.byref(lam), ctypes.byref(info))  # fmt: skip
        if info.value:
            return None
        roots[j], delta[j] = lam.value, row
    # Gu-Eisenstat: z_i^2 = prod_j (root_j - D_i) / prod_{k != i} (D_k - D_i), each root paired with a neighbouring
    # pole (every ratio in (0, 1]: no overflow, and no underflow below z_i^2)
    diff = dl[None, :] - dl[:, None]  # (i, k): D_k - D_i
    pair = np.arange(m - 1)[None, :] + (np.arange(m - 1)[None, :] >= np.arange(m)[:, None])  # root j <-> pole j or j+1
    ratio = np.take_along_axis(diff, pair, axis=1)
    del diff, pair
    np.divide(delta.T, ratio, out=ratio)
    z_hat = np.sqrt(np.abs(np.prod(ratio, axis=1))) * np.where(zl < 0, -1.0, 1.0)
    del ratio
    vectors = z_hat[:, None] / delta.T  # (D - root_j)^-1 z, column j
    del delta
    vectors /= np.linalg.norm(vectors, axis=0)
    eigenvalues = np.concatenate([roots, d_sorted[~live]])
    full = np.zeros((len(poles), len(eigenvalues)))
    index = np.flatnonzero(live)
    full[index[:, None], np.arange(m - 1)[None, :]] = vectors
    full[np.flatnonzero(~live), m - 1 + np.arange(int((~live).sum()))] = 1.0
    ascending = np.argsort(eigenvalues, kind="stable")
    back = np.empty_like(full)
    back[order] = full  # rows back to the poles' own order
    return eigenvalues[ascending], back[:, ascending]


def raw_span_solve(eigenvalues: torch.Tensor, transform: torch.Tensor, mean: torch.Tensor):
    """(eigenvalues descending, transform) of Rayleigh-Ritz on the raw span {z w}, from a centered generalized solve
    of full rank (transform d x d, its features (z - mean) transform); None when the poles do not interlace."""
    d = transform.shape[0]
    if transform.shape[1] != d:
        return None
    v = (transform.T @ mean).numpy()
    poles = np.concatenate([[1.0], eigenvalues.numpy()])
    solved = restricted_eigh(poles, np.concatenate([[1.0], -v]))
    if solved is None or solved[0].shape[0] != d:
        return None
    values, y = solved
    coefficients = np.ascontiguousarray(y[1:, ::-1])  # psi coordinates, eigenvalues descending
    return torch.from_numpy(values[::-1].copy()), torch.from_numpy(transform.numpy() @ coefficients)


def paper_convention(result: RRResult, acc: RRAccumulator, center: bool, ridge: float, rtol: float) -> RRResult | None:
    """`solve(acc, "generalized", trivial="keep")` from the export's own centered solve `result`, when that solve
    kept every dimension and the raw Gram is plainly of full rank as well (so the solve from the raw moments
    would keep every dimension too); None otherwise (the caller solves from the raw moments)."""
    if result.mode != "generalized" or center or ridge != 0 or result.trivial is None:
        return None
    transform, mean = result.transform, result.mean
    d = transform.shape[0]
    # the raw Gram's smallest eigenvalue is at least the centered one's, 1 / ||T||_2^2 >= 1 / ||T||_F^2; its largest at
    # most trace(G_c) + |mean|^2: the range test of `solve` (eigenvalues > rtol * the largest) keeps all of them
    trace = float((torch.diagonal(acc.c_ff) + torch.diagonal(acc.c_gg)).sum()) / (2 * acc.n)
    trace += float(((acc.mean_f - mean).square().sum() + (acc.mean_g - mean).square().sum()) / 2)
    if transform.shape[1] != d or not 1 / float(transform.square().sum()) > rtol * (trace + float(mean @ mean)):
        return None
    solved = raw_span_solve(result.eigenvalues, transform, mean)
    if solved is None:
        return None
    values, raw_transform = solved
    fix_signs(raw_transform)
    paper = RRResult(values, raw_transform, torch.zeros_like(mean), "generalized", acc.n)
    paper.dims = {"dim": d, "dead": 0, "constant": 0, "dependent": 0, "features": d}
    return paper
