"""Batch moment estimators and their reduction across ranks.

Every objective is a function of a few d x d moment matrices and per-mode sums. Summing those across
ranks (O(d^2) bytes per step, whatever the batch size) gives the global-batch estimate. The sum uses the
autograd-aware all-reduce: its backward all-reduces the gradient, so after DDP averages parameter
gradients over W ranks the result equals the single-process gradient on the concatenated batch
(a raw dist.all_reduce in the forward pass would silently drop the other ranks' contributions).

Gathering the features instead moves O(B d) bytes (global batch B) but makes every rank compute the moments
of the whole batch: `choose_reduction` weighs both (README "Reduction across ranks", benchmarks/scaling.md).
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
    flat = _autograd_collective("all_reduce", torch.cat([stats[n].reshape(-1).to(dtype) for n in names]))
    out, offset = {}, 0
    for n in names:
        size = stats[n].numel()
        out[n] = flat[offset : offset + size].view_as(stats[n])
        offset += size
    return out


def _autograd_collective(name: str, tensor: torch.Tensor):
    with warnings.catch_warnings():
        # torch 2.15 deprecates this module for functional collectives; its autograd semantics (backward =
        # all-reduce of the gradient, or its sum over ranks for all_gather) are what the two-process
        # gradient tests pin down, so keep it.
        warnings.simplefilter("ignore", FutureWarning)
        import torch.distributed.nn.functional as collectives

        return getattr(collectives, name)(tensor)


REDUCTIONS = ("auto", "moments", "gather")


def reduction_costs(
    stat_numel: int, width: int, rows: list[int], element_size: int, flops_per_byte: float
) -> dict[str, float]:
    """Per-rank cost of one step of each exact route, in bytes (compute counted as flops / flops_per_byte).

    rows: every rank's local batch; width: numbers per gathered row (f and g: 2 d). Ring collectives: an
    all-reduce sends 2(W-1)/W of the stats, an all-gather (padded to the largest batch) (W-1) batches. A Gram
    sum costs ~2 flops per stat entry per row: the moments route sums its own rows (the largest rank sets the
    pace), the gather route every row. Backward doubles both routes' bytes and flops alike.
    """
    world, most, total = len(rows), max(rows), sum(rows)
    flops_per_row = 2.0 * stat_numel
    return {
        "moments": 2.0 * (world - 1) / world * stat_numel * element_size + flops_per_row * most / flops_per_byte,
        "gather": float((world - 1) * most * width * element_size) + flops_per_row * total / flops_per_byte,
    }


def choose_reduction(stat_numel: int, width: int, rows: list[int], element_size: int, flops_per_byte: float) -> str:
    """'gather' where it is strictly cheaper than all-reducing the moments, else 'moments'."""
    costs = reduction_costs(stat_numel, width, rows, element_size, flops_per_byte)
    return "gather" if costs["gather"] < costs["moments"] else "moments"


def exchange_sizes(rows: int, device: torch.device) -> list[int]:
    """Every rank's local batch size (one tiny all-gather; reading it on the host waits for it)."""
    mine = torch.tensor([rows], device=device)
    out = [torch.empty_like(mine) for _ in range(world_size())]
    dist.all_gather(out, mine)
    return torch.cat(out).tolist()


def gather_other_rows(z: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The other ranks' rows of z in rank order, keeping the autograd graph (backward sums the gradient of
    each rank's rows over ranks, as the all-reduce does for the moments). Ragged batches are padded."""
    padded = torch.nn.functional.pad(z, (0, 0, 0, max(sizes) - len(z)))
    parts = _autograd_collective("all_gather", padded)
    rank = dist.get_rank()
    return torch.cat([part[:n] for r, (part, n) in enumerate(zip(parts, sizes)) if r != rank])


def split_even_odd(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split A = even positions, split B = odd positions of the local batch.

    With even local batch sizes this is the same split of the global batch for any number of ranks.
    """
    return z[0::2], z[1::2]


def set_matmul_tf32(enabled: bool) -> bool:
    """Allow TF32 for fp32 CUDA matmuls or not; returns the previous setting.

    Through `torch.set_float32_matmul_precision`, which keeps torch's legacy flag (``allow_tf32``) and the newer
    ``fp32_precision`` consistent: setting only the new one makes any later read of the legacy flag raise, and
    Inductor reads it when it compiles a matmul."""
    previous = torch.get_float32_matmul_precision() != "highest"
    torch.set_float32_matmul_precision("high" if enabled else "highest")
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


def device_scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor of `like`'s dtype and device filled on the device (`new_tensor` of a Python number is a
    blocking host-to-device copy on a GPU: one wait for the queue per call)."""
    return torch.full((), float(value), dtype=like.dtype, device=like.device)
