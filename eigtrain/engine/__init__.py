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

import warnings
from typing import Any

import torch
from torch import nn

from eigtrain.engine.base import PRECISIONS, LossFn, StepResult, chunks, use_channels_last
from eigtrain.engine.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_at
from eigtrain.schema import EngineConfig, OptimBase

ENGINES = ("ddp", "deepspeed")


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(mode: str, device: torch.device, engine: str, grad_accum_steps: int) -> str:
    """engine.compile_mode where it holds, else "default" with a warning saying why. CUDA graphs
    (reduce-overhead) need CUDA, the ddp engine (DeepSpeed's step is its own) and one micro-batch per step: with
    gradient caching the encoder runs twice per micro-batch and a graph replay would overwrite the embeddings kept
    from an earlier one."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"engine.compile_mode={mode!r} is not known; allowed: {', '.join(COMPILE_MODES)}")
    if mode in ("default", "max-autotune-no-cudagraphs"):
        return mode
    why = (
        "CUDA graphs need a CUDA device"
        if torch.device(device).type != "cuda"
        else f"engine.name={engine} runs its own step"
        if engine != "ddp"
        else f"{grad_accum_steps} micro-batches per step (gradient caching runs the encoder twice per micro-batch)"
        if grad_accum_steps > 1
        else None
    )
    if why is None:
        return mode
    fallback = "max-autotune-no-cudagraphs" if mode == "max-autotune" else "default"
    warnings.warn(f"engine.compile_mode={mode}: {why}; compiling with mode={fallback}", stacklevel=2)
    return fallback


def build_engine(
    config: EngineConfig,
    optim: OptimBase,
    model: nn.Module,
    *,
    device: torch.device,
    micro_batch_size: int,
    grad_accum_steps: int,
):
    """Engine from the ``engine`` config group (``optim`` gives the optimizer and gradient clipping); both are
    taken as their schema dataclasses (eigtrain.schema), so every key has its one default there."""
    common: dict[str, Any] = dict(
        device=device,
        precision=config.precision,
        grad_clip=optim.grad_clip,
        compile=config.compile,
        channels_last=use_channels_last(config.channels_last, model, device),
    )
    if config.name == "ddp":
        from eigtrain.engine.ddp import DDPEngine

        mode = compile_mode(config.compile_mode, device, config.name, grad_accum_steps) if config.compile else "default"
        return DDPEngine(model, optim, compile_mode=mode, **common)
    if config.name == "deepspeed":
        from eigtrain.engine.deepspeed_zero import DeepSpeedEngine

        if config.compile:  # warns: DeepSpeed compiles its way
            compile_mode(config.compile_mode, device, config.name, grad_accum_steps)
        return DeepSpeedEngine(
            model,
            optim,
            stage=config.zero_stage,
            micro_batch_size=micro_batch_size,
            grad_accum_steps=grad_accum_steps,
            extra_config=dict(config.config),
            **common,
        )
    raise ValueError(f"engine.name={config.name!r} is not known; allowed: {', '.join(ENGINES)}")


__all__ = [
    "COMPILE_MODES",
    "ENGINES",
    "OPTIMIZERS",
    "PRECISIONS",
    "SCHEDULES",
    "LossFn",
    "StepResult",
    "build_engine",
    "build_optimizer",
    "chunks",
    "compile_mode",
    "lr_at",
]
