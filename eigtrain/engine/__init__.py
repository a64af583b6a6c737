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
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from eigtrain.engine.base import PRECISIONS, LossFn, StepResult, chunks, use_channels_last
from eigtrain.engine.optim import OPTIMIZERS, SCHEDULES, build_optimizer, lr_at
from eigtrain.schema import EngineConfig, OptimBase

ENGINES = ("ddp", "deepspeed")


COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# `auto`: CUDA graphs where the step is launch-bound. A step's kernels are launched one by one from the host; on small
# images each kernel is short and the launches dominate (ResNet-18 at 32 px on an H100: 59-60 % of the bare model
# compiled in the default mode, 94 % with CUDA graphs), while at 224 px the kernels are long enough to hide them
# (ResNet-50 compiled, default mode: 93 %) and graphs would only add their memory. The line between is the image
# side the augmentation presets already use to tell small images from large ones.
LAUNCH_BOUND_MAX_SIDE = 64


def _cuda_graphs_refused(device: torch.device, engine: str, grad_accum_steps: int) -> str | None:
    """Why CUDA graphs cannot run this step, or None where they hold."""
    if torch.device(device).type != "cuda":
        return "CUDA graphs need a CUDA device"
    if engine != "ddp":
        return f"engine.name={engine} runs its own step"
    if grad_accum_steps > 1:
        return f"{grad_accum_steps} micro-batches per step (gradient caching runs the encoder twice per micro-batch)"
    return None


def compile_mode(
    mode: str, device: torch.device, engine: str, grad_accum_steps: int, view_hw: Sequence[int] | None = None
) -> str:
    """engine.compile_mode where it holds, else "default" with a warning saying why. CUDA graphs
    (reduce-overhead) need CUDA, the ddp engine (DeepSpeed's step is its own) and one micro-batch per step: with
    gradient caching the encoder runs twice per micro-batch and a graph replay would overwrite the embeddings kept
    from an earlier one. "auto" (the default) takes CUDA graphs where they hold and the views the encoder sees
    (`view_hw`, [H, W]) are small enough for the step to be launch-bound, else the default mode, silently."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"engine.compile_mode={mode!r} is not known; allowed: {', '.join(COMPILE_MODES)}")
    why = _cuda_graphs_refused(device, engine, grad_accum_steps)
    if mode == "auto":
        small = view_hw is not None and max(view_hw) <= LAUNCH_BOUND_MAX_SIDE
        return "reduce-overhead" if why is None and small else "default"
    if mode in ("default", "max-autotune-no-cudagraphs") or why is None:
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
    view_hw: Sequence[int] | None = None,
):
    """Engine from the ``engine`` config group (``optim`` gives the optimizer and gradient clipping); both are
    taken as their schema dataclasses (eigtrain.schema), so every key has its one default there. `view_hw`: the
    [H, W] of the views the encoder sees, for engine.compile_mode=auto."""
    common: dict[str, Any] = dict(
        device=device,
        precision=config.precision,
        grad_clip=optim.grad_clip,
        compile=config.compile,
        channels_last=use_channels_last(config.channels_last, model, device),
    )
    if config.name == "ddp":
        from eigtrain.engine.ddp import DDPEngine

        mode = (
            compile_mode(config.compile_mode, device, config.name, grad_accum_steps, view_hw)
            if config.compile
            else "default"
        )
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
