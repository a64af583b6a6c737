"""Optimizers (SGD, LARS, AdamW) and the learning-rate schedule, a pure function of the step."""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import nn

from eigtrain.schema import OPTIM_SCHEMAS, AdamWConfig, LarsConfig, OptimBase, SGDConfig

OPTIMIZERS = tuple(OPTIM_SCHEMAS)  # each optimizer's keys and defaults: its dataclass in eigtrain.schema
SCHEDULES = ("cosine", "constant")


def _param_groups(model: nn.Module, weight_decay: float, exclude_bias_and_norm: bool) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not exclude_bias_and_norm:
        return [{"params": params, "weight_decay": weight_decay}]
    # Biases and normalization scales are 1-d; decaying them (or LARS-adapting them) hurts SSL training.
    decay = [p for p in params if p.ndim > 1]
    no_decay = [p for p in params if p.ndim <= 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: OptimBase, device_type: str = "cpu") -> torch.optim.Optimizer:
    """Optimizer from the ``optim`` config group (typed by its name: SGDConfig, LarsConfig, AdamWConfig). The
    learning rate is set every step from ``lr_at``.

    On CUDA SGD and AdamW are torch's fused kernels, which skip a non-finite step inside the kernel (`guarded_step`)
    and keep AdamW's step count on the GPU (so the guarded update never reads it back to the host)."""
    groups = _param_groups(model, config.weight_decay, config.exclude_bias_and_norm)
    if isinstance(config, SGDConfig):
        fused = True if device_type == "cuda" else None  # the guarded step skips inside the kernel (found_inf)
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum, nesterov=config.nesterov, fused=fused)
    if isinstance(config, LarsConfig):
        from timm.optim import Lars  # noqa: PLC0415  (timm is slow to import)

        # timm's LARS adapts only parameters with weight decay, so excluded groups get plain SGD.
        return Lars(groups, lr=config.lr, momentum=config.momentum, trust_coeff=config.trust_coeff)
    if isinstance(config, AdamWConfig):
        return torch.optim.AdamW(
            groups,
            lr=config.lr,
            betas=cast(tuple[float, float], tuple(config.betas)),  # schema: List[float] of two rates
            eps=config.eps,
            fused=True if device_type == "cuda" else None,
        )
    raise ValueError(f"optim.name={config.name!r} is not known; allowed: {', '.join(OPTIMIZERS)}")


def lr_at(step: int, cfg: OptimBase, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine decay to ``final_lr``.

    A pure function of the step, so resuming needs no scheduler state. ``cfg``: the optim config (its dataclass,
    or the composed group: read by attribute, every key present).
    """
    base, warmup = float(cfg.lr), int(cfg.warmup_steps)
    if step < warmup:
        return base * (step + 1) / warmup
    if cfg.schedule == "constant":
        return base
    final = float(cfg.final_lr)
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return final + 0.5 * (base - final) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
