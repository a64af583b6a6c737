"""Encoders: backbone + projector MLP, and the two-encoder module for stored pairs (SVD case)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence, cast

import torch
from torch import nn

from eigtrain.models.backbones import build_backbone
from eigtrain.schema import ModelConfig, typed

log = logging.getLogger(__name__)


class Projector(nn.Sequential):
    """``layers`` hidden blocks Linear -> BatchNorm -> ReLU, then a linear output of width ``dim``."""

    def __init__(self, in_features: int, dim: int, *, hidden: int, layers: int, batch_norm: bool):
        blocks: list[nn.Module] = []
        width = in_features
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden, bias=not batch_norm)]
            blocks += [nn.BatchNorm1d(hidden)] if batch_norm else []
            blocks += [nn.ReLU(inplace=True)]
            width = hidden
        blocks.append(nn.Linear(width, dim))
        super().__init__(*blocks)


class Encoder(nn.Module):
    """z = projector(backbone(x)). ``features`` gives the backbone output (linear probes, export)."""

    def __init__(self, backbone: nn.Module, projector: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))


class PairEncoder(nn.Module):
    """Two encoders for stored pairs (x, a): phi embeds inputs, psi embeds contexts (SVD case)."""

    def __init__(self, phi: Encoder, psi: Encoder):
        super().__init__()
        self.phi: nn.Module = phi  # an Encoder, or a wrapper of one (eigtrain.export.embed.L2Normalized)
        self.psi: nn.Module = psi

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.phi(x), self.psi(a)


def _build_one(cfg: ModelConfig, dim: int, input_shape: Sequence[int]) -> Encoder:
    backbone = build_backbone(cfg, input_shape)
    projector = Projector(
        cast(int, backbone.num_features),  # every backbone exposes num_features (build_backbone)
        dim,
        hidden=cfg.projector_hidden,
        layers=cfg.projector_layers,
        batch_norm=cfg.projector_batch_norm,
    )
    return Encoder(backbone, projector)


def context_config(cfg: ModelConfig) -> ModelConfig:
    """The psi encoder's config for pairs data: ``cfg.context`` (the keys that differ from phi's) over ``cfg``,
    checked against the schema (an unknown key or a bad value is a ConfigError naming it)."""
    return typed(ModelConfig, {**dataclasses.asdict(cfg), **(cfg.context or {}), "context": None})


def build_encoder(
    cfg: ModelConfig,
    dim: int,
    input_shape: Sequence[int],
    context_shape: Sequence[int] | None = None,
) -> Encoder | PairEncoder:
    """Build the encoder described by the ``model`` config group.

    With ``context_shape`` (pairs data) this returns a ``PairEncoder``: ``phi`` for inputs of
    ``input_shape`` and ``psi`` for contexts, whose architecture is ``cfg.context`` merged over ``cfg``
    (``context: null`` means the same architecture as ``phi``).
    """
    encoder = _build_one(cfg, dim, input_shape)
    if context_shape is None:
        return encoder
    return PairEncoder(encoder, _build_one(context_config(cfg), dim, context_shape))


def convert_sync_batch_norm(model: nn.Module) -> nn.Module:
    """BatchNorm statistics over the global batch (multi-GPU runs with small per-rank batches)."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)


def use_sync_batch_norm(model: nn.Module, enabled: bool, world_size: int, device: torch.device) -> nn.Module:
    """``model`` with SyncBatchNorm when ``model.sync_batch_norm`` is on and the job has several GPU ranks.

    PyTorch's SyncBatchNorm runs on GPUs only: CPU (gloo) jobs keep per-process BatchNorm, with a warning."""
    if not enabled or world_size == 1:
        return model
    if device.type != "cuda":
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            log.warning(
                "model.sync_batch_norm=true but the ranks run on %s: SyncBatchNorm needs GPUs, so each "
                "process normalizes with its own batch statistics",
                device.type,
            )
        return model
    return convert_sync_batch_norm(model)
