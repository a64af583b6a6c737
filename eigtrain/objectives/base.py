"""The shared forward pass of every objective: check, fp32, moments, one all-reduce, masked loss."""

from __future__ import annotations

from typing import Any, Callable, cast

import torch
from torch import nn

from eigtrain.objectives.moments import (
    REDUCTIONS,
    all_reduce_sum,
    choose_reduction,
    device_scalar,
    exchange_sizes,
    full_fp32_matmul,
    gather_other_rows,
    world_size,
)
from eigtrain.objectives.nesting import Nesting
from eigtrain.schema.objectives import common_options


class Objective(nn.Module):
    """Base class. A family defines `defaults` (from its schema dataclass, eigtrain.schema.objectives), `moments` (local sums) and `combine` (loss from sums).

    moments(f, g, sequential, ctx) -> dict of local batch sums (tensors); summed over ranks.
    combine(stats, own) -> (loss, terms); own=True uses the sequential ("own") masks.

    Across ranks the stats are exact either way: all-reduced (reduction='moments'), or every rank gathers the
    other ranks' features and adds their moments to its own (reduction='gather'); 'auto' picks the cheaper by
    `choose_reduction`, with `reduction_flops_per_byte` = matmul flop/s over per-rank link bytes/s.
    local_batch: the expected per-rank batch, so that 'auto' needs no size exchange while moments win.
    """

    name = "objective"
    defaults: dict[str, Any] = {}
    split_batch = False  # split-batch (even/odd) estimators need an even local batch
    default_pairs = False
    allows_pairs = True
    # Keys every objective takes besides its family's coefficients; defaults: eigtrain.schema.objectives.
    # 125 flops/byte: an H100's IEEE fp32 matmul (~50 TFLOP/s) over NCCL's ~400 GB/s bus bandwidth on NVSwitch or
    # 8 x 400 Gb/s NDR per node (benchmarks/scaling.md; ~1,000 with one NIC per node).
    options: dict[str, Any] = common_options()

    def __init__(
        self,
        dim: int,
        nesting: Nesting,
        distributed: bool = True,
        pairs: bool | None = None,
        local_batch: int | None = None,
        **coefficients,
    ):
        super().__init__()
        options = {k: coefficients.pop(k, default) for k, default in self.options.items()}
        self.reduction, self.flops_per_byte = options["reduction"], float(options["reduction_flops_per_byte"])
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction={self.reduction!r} is unknown; allowed: {', '.join(REDUCTIONS)}")
        if not self.flops_per_byte > 0:
            raise ValueError(f"reduction_flops_per_byte must be positive, got {self.flops_per_byte}")
        self.local_batch, self.last_route = local_batch, "moments"
        unknown = sorted(set(coefficients) - set(self.defaults))
        if unknown:
            allowed = ", ".join(self.defaults) or "none"
            raise ValueError(f"unknown coefficient(s) {unknown} for objective {self.name!r}; allowed: {allowed}")
        self.coef = {**self.defaults, **coefficients}
        self.dim, self.nesting, self.distributed = dim, nesting, distributed
        self.pairs = self.default_pairs if pairs is None else bool(pairs)
        if self.pairs and not self.allows_pairs:
            raise ValueError(f"objective {self.name!r} is defined for one encoder on two views only (pairs=False)")

    # -- masks -------------------------------------------------------------------------------
    def register_masks(self, name: str, g: Callable[[int], float] | None = None) -> None:
        """Buffers <name>_vec/<name>_mat for the nested sum, and the sequential ("own") versions."""
        for own in (False, True):
            vec, mat = self.nesting.masks(g, own=own)
            tag = "own_" if own else ""
            self.register_buffer(f"{tag}{name}_vec", vec, persistent=False)
            self.register_buffer(f"{tag}{name}_mat", mat, persistent=False)

    def mask(self, name: str, own: bool, like: torch.Tensor, matrix: bool = False) -> torch.Tensor:
        tensor = getattr(self, f"{'own_' if own else ''}{name}_{'mat' if matrix else 'vec'}")
        return tensor.to(like.dtype)

    # -- forward -----------------------------------------------------------------------------
    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.check_inputs(z1, z2)
        dtype = torch.float64 if z1.dtype == torch.float64 else torch.float32
        with torch.autocast(device_type=z1.device.type, enabled=False), full_fp32_matmul(z1.device.type):
            return self._loss(z1.to(dtype), z2.to(dtype))

    def check_inputs(self, z1: torch.Tensor, z2: torch.Tensor) -> None:
        for label, z in (("z1", z1), ("z2", z2)):
            if z.ndim != 2 or z.shape[1] != self.dim:
                raise ValueError(f"{label} must have shape (batch, {self.dim}), got {tuple(z.shape)}")
        if z1.shape[0] != z2.shape[0]:
            raise ValueError(f"z1 and z2 must have the same batch size, got {z1.shape[0]} and {z2.shape[0]}")
        if z1.shape[0] < 2:
            raise ValueError(f"objective {self.name!r} needs a local batch of at least 2, got {z1.shape[0]}")
        if self.split_batch and z1.shape[0] % 2:
            raise ValueError(
                f"objective {self.name!r} splits each local batch into even/odd halves and needs an even "
                f"local batch size, got {z1.shape[0]}"
            )

    def prepare(self, f: torch.Tensor, g: torch.Tensor):
        """Feature transforms before the moments (normalization, centering); returns (f, g, ctx)."""
        return f, g, None

    def global_mean(self, *zs: torch.Tensor) -> torch.Tensor:
        """Mean over the global batch of the given (pooled) tensors, differentiable."""
        total = cast(torch.Tensor, sum(z.sum(0) for z in zs))  # a tensor: zs is not empty
        s = {"sum": total, "n": device_scalar(sum(len(z) for z in zs), zs[0])}
        s = all_reduce_sum(s, self.distributed)
        return s["sum"] / s["n"]

    def center(self, f: torch.Tensor, g: torch.Tensor):
        """Remove the constant mode: pooled mean for one encoder, one mean per side for pairs."""
        if self.pairs:
            return f - self.global_mean(f), g - self.global_mean(g)
        mean = self.global_mean(f, g)
        return f - mean, g - mean

    def spectrum_features(self, f, g, ctx):
        return f, g

    def local_stats(self, f: torch.Tensor, g: torch.Tensor, ctx) -> dict[str, torch.Tensor]:
        """Every sum the loss needs, over the given rows."""
        stats = self.moments(f, g, False, ctx)
        if self.nesting.sequential:
            stats.update({"seq." + k: v for k, v in self.moments(f, g, True, ctx).items()})
        sf, sg = (z.detach() for z in self.spectrum_features(f, g, ctx))
        stats.update({"spec.fg": (sf * sg).sum(0), "spec.ff": sf.pow(2).sum(0), "spec.gg": sg.pow(2).sum(0)})
        return stats

    def route(self, stats: dict[str, torch.Tensor], f: torch.Tensor) -> tuple[str, list[int] | None]:
        """('moments', None) or ('gather', every rank's batch size); the same answer on every rank."""
        world = world_size() if self.distributed else 1
        if world == 1 or self.reduction == "moments":
            return "moments", None
        numel, width, size = sum(v.numel() for v in stats.values()), 2 * f.shape[1], f.element_size()
        # Gathering costs more with every row: if it loses at the expected batch on every rank (without a hint,
        # the smallest, 2), no size exchange; a short (ragged) batch then keeps the moments route, just as exact.
        # Sizes are exchanged, and the exact ones decide, only where gathering may win.
        if self.reduction == "auto":
            expected = [self.local_batch or 2] * world
            if choose_reduction(numel, width, expected, size, self.flops_per_byte) == "moments":
                return "moments", None
        sizes = exchange_sizes(len(f), f.device)
        if self.reduction == "auto" and choose_reduction(numel, width, sizes, size, self.flops_per_byte) == "moments":
            return "moments", None
        return "gather", sizes

    def _loss(self, f: torch.Tensor, g: torch.Tensor):
        f, g, ctx = self.prepare(f, g)
        stats = self.local_stats(f, g, ctx)
        route, sizes = self.route(stats, f)
        self.last_route = route  # for tests and logs
        if route == "gather":
            # This rank's own sums stay as they are; the others' rows arrive whole, and their moments are
            # added. Ranks are concatenated in order (split-batch objectives keep each rank's even/odd split,
            # as every local batch is even).
            assert sizes is not None  # the gather route comes with every rank's size
            others = gather_other_rows(torch.cat([f, g], 1), sizes)
            more = self.local_stats(others[:, : f.shape[1]], others[:, f.shape[1] :], ctx)
            stats = {k: v + more[k] for k, v in stats.items()}
        else:
            stats = all_reduce_sum(stats, self.distributed)
        loss, terms = self.combine(stats, own=False)
        if self.nesting.sequential:
            seq = {k[4:]: v for k, v in stats.items() if k.startswith("seq.")}
            surrogate, _ = self.combine(seq, own=True)
            # The value of the nested sum, the gradient of the stop-gradient (sequential) surrogate.
            loss = loss.detach() + (surrogate - surrogate.detach())

        terms = {k: v.detach() for k, v in terms.items()}
        denom = (stats["spec.ff"] * stats["spec.gg"]).sqrt().clamp_min(torch.finfo(f.dtype).tiny)
        terms["eigenvalues"] = (stats["spec.fg"] / denom).detach()
        return loss, terms

    def moments(self, f, g, sequential: bool, ctx) -> dict[str, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def combine(self, stats: dict[str, torch.Tensor], own: bool):  # pragma: no cover
        raise NotImplementedError

    def extra_repr(self) -> str:
        coef = ", ".join(f"{k}={v}" for k, v in self.coef.items())
        return f"dim={self.dim}, nesting={self.nesting.mode}, pairs={self.pairs}" + (f", {coef}" if coef else "")
