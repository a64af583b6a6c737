"""DeepSpeed engine: ZeRO stages 1-3, checkpoints through DeepSpeed's save_checkpoint/load_checkpoint.

DeepSpeed is imported lazily: it is slow to import and only this engine needs it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.distributed as dist
from torch import nn

from eigtrain.engine.base import LossFn, StepResult, accumulated_backward, autocast, resolve_precision
from eigtrain.engine.optim import build_optimizer, set_lr
from eigtrain.schema import OptimBase

ZERO_STAGES = (1, 2, 3)


def _weights_only_load(path: str, map_location: Any = None) -> Any:
    # DeepSpeed's TorchCheckpointEngine loads with weights_only=False; allow only the three plain
    # DeepSpeed classes its ZeRO checkpoints contain (eigtrain.runs.checkpoint_read), one line when that fails.
    from eigtrain.runs.checkpoint_read import load_tensors

    return load_tensors(Path(path), map_location=map_location)


def _skip_shared_memory_op() -> None:
    """DeepSpeed's CPU communication backend JIT-compiles a C++ op (deepspeed_shm_comm, 1-4 min of g++ in a fresh
    environment, again whenever its build command changes) the first time it sets up; only its
    inference_all_reduce uses the op, never training. Marked incompatible, the backend goes without it."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


class DeepSpeedEngine:
    name = "deepspeed"

    def __init__(
        self,
        model: nn.Module,
        optim_cfg: OptimBase,
        *,
        device: torch.device,
        stage: int | None,  # engine.zero_stage: None (unset) is refused below, naming the key
        micro_batch_size: int,
        grad_accum_steps: int,
        precision: str = "auto",
        grad_clip: float | None = None,
        compile: bool = False,
        channels_last: bool = False,
        extra_config: Mapping[str, Any] | None = None,
    ):
        import deepspeed
        from deepspeed.runtime.checkpoint_engine import TorchCheckpointEngine

        if stage not in ZERO_STAGES:
            raise ValueError(f"engine.zero_stage={stage} is not supported; allowed: {', '.join(map(str, ZERO_STAGES))}")
        _skip_shared_memory_op()
        if not dist.is_initialized():
            # DeepSpeed needs a process group even for a single process; a local store needs no port.
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
            )
        self.device = device
        self.autocast_dtype = resolve_precision(precision, device)
        model.to(device)
        # The trainer hands the views over in channels_last, which alone selects cuDNN's NHWC kernels; the
        # parameters stay contiguous, since DeepSpeed broadcasts each one as a byte view (`p.data.view(uint8)`
        # fails on a channels_last weight: first seen on an H200) and ZeRO flattens them anyway.
        self.channels_last = channels_last
        config = {
            "train_micro_batch_size_per_gpu": micro_batch_size,
            "gradient_accumulation_steps": grad_accum_steps,
            "gradient_clipping": float(grad_clip or 0.0),
            # Parameters stay fp32 (DeepSpeed's own fp16/bf16 modes are off); the encoder forward runs
            # under torch.autocast like the DDP engine, and the objective in fp32.
            "zero_optimization": {"stage": stage},
            "zero_allow_untested_optimizer": True,  # SGD / LARS under ZeRO
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
            **(dict(extra_config) if extra_config else {}),
        }
        self.ds, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=build_optimizer(model, optim_cfg), config=config, dist_init_required=False
        )
        if isinstance(self.ds.checkpoint_engine, TorchCheckpointEngine):
            self.ds.checkpoint_engine.load = _weights_only_load
        if compile:
            self.ds.compile()
        self.stage = stage
        self.model = self.ds.module
        self.train_module = self.ds

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.autocast_dtype)

    def train_step(self, micro_batches: list[Any], loss_fn: LossFn, lr: float, usable: bool = True) -> StepResult:
        """DeepSpeed reduces, clips and applies; its ZeRO optimizer checks the gradients for inf/NaN on all
        ranks before the update and skips it (counted in ``skipped_steps``; that check is DeepSpeed's own host
        synchronisation). The accumulated gradient is exact for the global batch (`accumulated_backward`).
        usable=False: this rank's batch stands in for an unusable one and every rank skips the update."""
        self.ds.train()
        skipped_before, last, skip = self.ds.skipped_steps, len(micro_batches) - 1, False

        def backward(t: torch.Tensor, i: int) -> None:
            nonlocal skip
            # A non-finite loss must never be applied, even if its gradient happened to be finite: a
            # constant factor (exactly 1, or NaN) makes every gradient NaN so the overflow check fires.
            t = t * torch.where(torch.isfinite(t.detach()), 1.0, float("nan"))
            if i == 0:  # whether fp32 ZeRO checks for overflow depends on DeepSpeed's version: check here first
                skip = not finite_on_every_rank(t)
            if skip:
                return  # no backward and no step: nothing accumulates, DeepSpeed's counters stay as they were
            # Each micro-batch's part is already its exact share of the batch gradient: no 1/accumulation.
            self.ds.backward(t, scale_wrt_gas=False)
            if i == last:
                set_lr(self.optimizer, lr)
            self.ds.step()  # an update only at the accumulation boundary

        loss, terms = accumulated_backward(
            self.ds, self.model, micro_batches, loss_fn, backward=backward, usable=usable
        )
        applied = self.ds.skipped_steps == skipped_before and not skip
        grad_norm = None if skip else self.ds.get_global_grad_norm()
        return StepResult(
            loss=loss,
            terms=terms,
            grad_norm=float("nan") if grad_norm is None else grad_norm,
            applied=torch.tensor(applied, device=loss.device),
        )

    def save(self, step_dir: Path, client_state: Mapping[str, Any]) -> None:
        # Every rank writes its ZeRO partition; no "latest" file (eigtrain.runs.checkpoint does discovery).
        self.ds.save_checkpoint(
            str(step_dir.parent), tag=step_dir.name, client_state=dict(client_state), save_latest=False
        )

    def load(self, step_dir: Path) -> None:
        from eigtrain.runs.checkpoint_read import CheckpointReadError, reading

        with reading(step_dir):
            path, _ = self.ds.load_checkpoint(str(step_dir.parent), tag=step_dir.name, load_lr_scheduler_states=False)
        if path is None:
            raise CheckpointReadError(step_dir, "DeepSpeed found no checkpoint there")

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The full model weights on CPU (ZeRO-3 gathers them; only rank 0 gets them then)."""
        if self.stage == 3:
            sd = self.ds._zero3_consolidated_16bit_state_dict() or {}
        else:
            sd = self.model.state_dict()
        return {k: v.detach().cpu() for k, v in sd.items()}


def finite_on_every_rank(t: torch.Tensor) -> bool:
    """Whether `t` is finite on every rank (one host read; DeepSpeed's step synchronises anyway). The first
    micro-batch's part already carries the global objective's finiteness; the vote keeps a rank-local
    non-finite value from leaving the ranks disagreeing on whether to step (a hang in ZeRO's collectives)."""
    flag = torch.isfinite(t.detach()).all().to(torch.float32)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
