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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.export.rayleigh_ritz import RRResult, fix_signs
from eigtrain.export.whitening import WHITENER_MARGIN, cholesky_whitener

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


def restricted_eigh(poles: np.ndarray, u: np.ndarray, vectors: bool = True) -> tuple[np.ndarray, Any] | None:
    """(ascending eigenvalues, eigenvectors as columns) of diag(poles) restricted to the complement of u: the
    len(poles) - 1 roots of the secular equation and their unit vectors (orthogonal to u; None with
    vectors=False: O(d) memory). None when two poles that u touches lie within rounding of each other (no strict
    interlacing: the caller solves another way)."""
    order = np.argsort(poles, kind="stable")
    d_sorted, z = poles[order].astype(np.float64), u[order].astype(np.float64)
    z = z / np.linalg.norm(z)
    scale = max(float(np.abs(d_sorted).max()), 1.0)
    live = np.abs(z) > 8 * EPS  # deflated: z_i at rounding, e_i is an eigenvector with eigenvalue D_i
    if live.sum() < 1 or np.any(np.diff(d_sorted[live]) <= 8 * EPS * scale):
        return None
    dl, zl = np.ascontiguousarray(d_sorted[live]), z[live] / np.linalg.norm(z[live])
    m = len(dl)
    roots = np.empty(m - 1)
    delta = np.empty((m - 1, m) if vectors else (1, m))  # delta[j]: D - root_j, accurate near each pole
    call, n_c, info = _dlaed4(), ctypes.c_int(m), ctypes.c_int(0)
    rho, lam = ctypes.c_double(RHO), ctypes.c_double(0.0)
    as_p = lambda a: a.ctypes.data_as(ctypes.POINTER(ctypes.c_double))  # noqa: E731
    row = np.empty(m)
    for j in range(m - 1):
        call(ctypes.byref(n_c), ctypes.byref(ctypes.c_int(j + 1)), as_p(dl), as_p(zl), as_p(row), ctypes.byref(rho),
             ctypes.byref(lam), ctypes.byref(info))  # fmt: skip
        if info.value:
            return None
        roots[j], delta[j if vectors else 0] = lam.value, row
    if not vectors:
        return np.sort(np.concatenate([roots, d_sorted[~live]]), kind="stable"), None
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


def raw_span_solve(eigenvalues: torch.Tensor, transform: torch.Tensor, mean: torch.Tensor, vectors: bool = True):
    """(eigenvalues descending, transform) of Rayleigh-Ritz on the raw span {z w}, from a centered generalized solve
    of full rank (transform d x d, its features (z - mean) transform); None when the poles do not interlace.
    vectors=False: (eigenvalues, None), O(d^2) work instead of the d^3 product."""
    d = transform.shape[0]
    if transform.shape[1] != d:
        return None
    v = (transform.T @ mean).numpy()
    poles = np.concatenate([[1.0], eigenvalues.numpy()])
    solved = restricted_eigh(poles, np.concatenate([[1.0], -v]), vectors)
    if solved is None or solved[0].shape[0] != d:
        return None
    values, y = solved
    if y is None:
        return torch.from_numpy(values[::-1].copy()), None
    coefficients = np.ascontiguousarray(y[1:, ::-1])  # psi coordinates, eigenvalues descending
    return torch.from_numpy(values[::-1].copy()), torch.from_numpy(transform.numpy() @ coefficients)


def raw_solve_full_rank(acc: RRAccumulator, result: RRResult, rtol: float) -> bool:
    """Whether the solve from the raw moments keeps every dimension through its Cholesky whitener, decided without
    its eigendecomposition. That solve equilibrates G = G_c + m m^T by S = diag(G)^-1/2 and takes the whitener when
    S G S's smallest eigenvalue is WHITENER_MARGIN above rtol * its largest. The centered solve's own ends
    (extra["gram_ends"]: of S_c G_c S_c, S_c = diag(G_c)^-1/2) bound both at no cost: with D = S / S_c <= 1,
    lambda_min(S G S) >= lambda_min(S_c G_c S_c) min(D)^2 and lambda_max(S G S) <= lambda_max(S_c G_c S_c) + |S m|^2.
    Where that is not enough (a coordinate's mean large against its spread), the raw solve's own test:
    `cholesky_whitener` on S G S (a d^3 / 3 factorization, no eigendecomposition)."""
    mean = result.mean
    ends = result.extra.get("gram_ends")
    if ends is not None:
        centered_diag = ends["scale"].square().reciprocal()
        raw_diag = centered_diag + mean.square()
        shrink = centered_diag / raw_diag  # D^2
        smallest = ends["smallest"] * float(shrink.min())
        largest = ends["largest"] + float((mean.square() / raw_diag).sum())
        if smallest > WHITENER_MARGIN * rtol * largest:
            return True
    raw = acc.view_gram(False)
    diag = torch.diagonal(raw)
    if not bool((diag > torch.finfo(torch.float64).tiny).all()):
        return False
    scale = diag.rsqrt()
    return cholesky_whitener(raw.mul_(scale[:, None]).mul_(scale[None, :]), 0.0, rtol, acc.n) is not None


@dataclass
class DerivedPaper:
    """The paper's convention where it is a function of the export itself (its eigenvalues, transform and mean,
    the centered solve of full rank): its eigenvalues now, its features when asked (`paper_from_export`). The d^3
    product T Y and a second d x d tensor in the file are then spent only by eval's RR (paper) row."""

    eigenvalues: torch.Tensor


def paper_from_export(eigenvalues: torch.Tensor, transform: torch.Tensor, mean: torch.Tensor):
    """(eigenvalues, transform) of the paper's convention from an export whose paper row was `DerivedPaper`."""
    solved = raw_span_solve(eigenvalues.double(), transform.double(), mean.double())
    if solved is None:
        raise ValueError("the export's paper convention cannot be derived from it (its poles do not interlace)")
    values, raw_transform = solved
    fix_signs(raw_transform)
    return values, raw_transform


def paper_convention(result: RRResult, acc: RRAccumulator, center: bool, ridge: float, rtol: float):
    """`solve(acc, "generalized", trivial="keep")` read off the export's own centered solve `result`, when that
    solve kept every dimension and the raw solve would too (`raw_solve_full_rank`): a `DerivedPaper` (its
    eigenvalues); None otherwise (the caller solves from the raw moments)."""
    if result.mode != "generalized" or center or ridge != 0 or result.trivial is None:
        return None
    transform, mean = result.transform, result.mean
    d = transform.shape[0]
    if transform.shape[1] != d or not raw_solve_full_rank(acc, result, rtol):
        return None
    solved = raw_span_solve(result.eigenvalues, transform, mean, vectors=False)
    return None if solved is None else DerivedPaper(solved[0])
