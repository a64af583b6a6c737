"""Batch moment estimators and their reduction across ranks.

Every objective is a function of a few d x d moment matrices and per-mode sums. Summing those across
ranks (O(d^2) bytes per step, whatever the batch size) gives the global-batch estimate. The sum uses the
autograd-aware all-reduce: its backward all-reduces the gradient, so after DDP averages parameter
gradients over W ranks the result equals the single-process gradient on the concatenated batch
(a raw dist.all_reduce in the forward pass would silently drop the other ranks' contributions).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist


def gram(a: torch.Tensor, b: torch.Tensor, sequential: bool = False) -> torch.Tensor:
    """a^T b summed over the batch (d_a x d_b).

    sequential=True keeps the same value but lets entry (i, j) pass gradient only through mode
    max(i, j): the earlier mode is a constant for the later one (stop-gradient nesting).
    """
    full = a.T @ b
    if not sequential:
        return full
    lower = torch.tril(a.T @ b.detach(), -1)  # i > j: gradient through a_i only
    upper = torch.triu(a.detach().T @ b, 1)  # i < j: gradient through b_j only
    return lower + upper + torch.diag_embed(torch.diagonal(full))


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce_sum(stats: dict[str, torch.Tensor], enabled: bool = True) -> dict[str, torch.Tensor]:
    """Sum a dict of tensors over all ranks in one collective, keeping the autograd graph."""
    if not enabled or world_size() == 1:
        return stats
    names = list(stats)
    dtype = stats[names[0]].dtype
    flat = torch.cat([stats[n].reshape(-1).to(dtype) for n in names])
    with warnings.catch_warnings():
        # torch 2.15 deprecates this module for functional collectives; its autograd semantics (backward =
        # all-reduce of the gradient) are what the two-process gradient test pins down, so keep it.
        warnings.simplefilter("ignore", FutureWarning)
        from torch.distributed.nn.functional import all_reduce

        flat = all_reduce(flat)
    out, offset = {}, 0
    for n in names:
        size = stats[n].numel()
        out[n] = flat[offset : offset + size].view_as(stats[n])
        offset += size
    return out


def split_even_odd(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split A = even positions, split B = odd positions of the local batch.

    With even local batch sizes this is the same split of the global batch for any number of ranks.
    """
    return z[0::2], z[1::2]


def set_matmul_tf32(enabled: bool) -> bool:
    """Allow TF32 for fp32 CUDA matmuls or not; returns the previous setting."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9 (mixing with the legacy flag is an error there)
        previous = matmul.fp32_precision == "tf32"
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        return previous
    previous = matmul.allow_tf32
    matmul.allow_tf32 = enabled
    return previous


@contextlib.contextmanager
def full_fp32_matmul(device_type: str):
    """IEEE fp32 matmuls inside the block on CUDA, even where the trainer enabled TF32 for the encoder:
    moment matrices are sums over the batch and lose digits quickly at TF32's 10-bit mantissa."""
    if device_type != "cuda":
        yield
        return
    previous = set_matmul_tf32(False)
    try:
        yield
    finally:
        set_matmul_tf32(previous)
