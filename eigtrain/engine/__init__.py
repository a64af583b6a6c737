"""Training engines behind one small interface.

An engine owns the model (``engine.model``, the plain module), the optimizer and the parallel wrapper
(``engine.train_module``), and offers:
  ``train_step(micro_batches, loss_fn, lr, usable=True) -> StepResult``  (loss_fn: a ``LossFn``, encode +
      objective; the accumulated gradient is exact for the global batch; non-finite loss/grad: update skipped,
      decided on the device; usable=False: this rank's batch is a stand-in and every rank skips the update)
  ``autocast()``  the encoder's mixed-precision context (the objective stays in fp32)
  ``save(step_dir, client_state)`` / ``load(step_dir)``  sharded model + optimizer state
  ``model_state_dict()``  the full weights for export
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from eigtrain.engine.base import PRECISIONS, LossFn, StepResult, chunks, use_channels_last
from eigtrain.engine.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_at
from eigtrain.schema import EngineConfig, OptimBase, typed, typed_option

ENGINES = ("ddp", "deepspeed")


def build_engine(
    cfg: EngineConfig | Mapping[str, Any],
    optim_cfg: OptimBase | Mapping[str, Any],
    model: nn.Module,
    *,
    device: torch.device,
    micro_batch_size: int,
    grad_accum_steps: int,
):
    """Engine from the ``engine`` config group (``optim`` gives the optimizer and gradient clipping); both are
    taken as their schema dataclasses (eigtrain.schema), so every key has its one default there."""
    cfg, optim_cfg = typed(EngineConfig, cfg), typed_option("optim", optim_cfg)
    common = dict(
        device=device,
        precision=cfg.precision,
        grad_clip=optim_cfg.grad_clip,
        compile=cfg.compile,
        channels_last=use_channels_last(cfg.channels_last, model, device),
    )
    if cfg.name == "ddp":
        from eigtrain.engine.ddp import DDPEngine

        return DDPEngine(model, optim_cfg, **common)
    if cfg.name == "deepspeed":
        from eigtrain.engine.deepspeed_zero import DeepSpeedEngine

        return DeepSpeedEngine(
            model,
            optim_cfg,
            stage=cfg.zero_stage,
            micro_batch_size=micro_batch_size,
            grad_accum_steps=grad_accum_steps,
            extra_config=dict(cfg.config),
            **common,
        )
    raise ValueError(f"engine.name={cfg.name!r} is not known; allowed: {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULES",
    "LossFn",
    "StepResult",
    "build_engine",
    "build_optimizer",
    "chunks",
    "lr_at",
]
