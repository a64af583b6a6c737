"""DDP engine: DistributedDataParallel (gloo on CPU, nccl on GPU), sharded checkpoints via torch.distributed.checkpoint."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Mapping, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from eigtrain.engine.base import LossFn, StepResult, accumulated_backward, autocast, guarded_step, resolve_precision
from eigtrain.engine.optim import build_optimizer, set_lr
from eigtrain.runs.checkpoint_read import (  # .metadata unpickled with an allow-list
    SafeFileSystemReader,
    WeightsOnlyLoadPlanner,
    reading,
    single_process_ok,
)
from eigtrain.schema import OptimBase


class DDPEngine:
    name = "ddp"

    def __init__(
        self,
        model: nn.Module,
        optim_cfg: OptimBase,
        *,
        device: torch.device,
        precision: str = "auto",
        grad_clip: float | None = None,
        compile: bool = False,
        channels_last: bool = False,
        compile_mode: str = "default",
    ):
        self.device = device
        self.cuda_graphs = compile and compile_mode == "reduce-overhead"  # `engine.compile_mode`
        self.autocast_dtype = resolve_precision(precision, device)
        self.grad_clip = grad_clip
        model.to(device)
        self.channels_last = channels_last  # the trainer hands the views over in the same layout
        if channels_last:
            model.to(memory_format=torch.channels_last)
        self.model = model  # the plain module: state dicts, export
        self.optimizer = build_optimizer(model, optim_cfg, device_type=device.type)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self._ddp: DistributedDataParallel | None = None
        wrapped: nn.Module = model
        if distributed:
            self._ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
            wrapped = self._ddp
        # torch.compile of a module is an OptimizedModule (an nn.Module); its stubs say only "a callable".
        self.train_module: nn.Module = (
            cast(nn.Module, torch.compile(wrapped, mode=compile_mode)) if compile else wrapped
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.autocast_dtype)

    def train_step(self, micro_batches: list[Any], loss_fn: LossFn, lr: float, usable: bool = True) -> StepResult:
        """Forward/backward over the micro-batches (exact global-batch objective, see `accumulated_backward`),
        then one optimizer step unless the loss or the gradient is non-finite (then the update is a no-op).
        No host synchronisation: the skip decision stays on the device (`StepResult.applied`). usable=False:
        this rank's batch stands in for an unusable one and every rank skips the update."""
        self.model.train()
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new step: the graphs' earlier outputs may be overwritten

        def sync_context(i: int) -> contextlib.AbstractContextManager:
            # Gradients are all-reduced only on the last micro-batch.
            last = i == len(micro_batches) - 1
            return self._ddp.no_sync() if (self._ddp is not None and not last) else contextlib.nullcontext()

        loss, terms = accumulated_backward(
            self.train_module,
            self.model,
            micro_batches,
            loss_fn,
            backward=lambda t, i: t.backward(),
            sync_context=sync_context,
            usable=usable,
        )
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.grad_clip if self.grad_clip else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        # The loss is the global-batch objective and DDP averaged the gradients, so this flag is the same on every
        # rank without a vote (a NaN on one rank reaches every rank through the all-reduces).
        ok = torch.isfinite(loss) & torch.isfinite(grad_norm)
        set_lr(self.optimizer, lr)
        guarded_step(self.optimizer, ok)
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(loss=loss, terms=terms, grad_norm=grad_norm.detach(), applied=ok)

    # -- checkpoints: every rank writes its shard of model + optimizer into step_dir
    def _state(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self, step_dir: Path, client_state: Mapping[str, Any]) -> None:
        # client_state (step, counters) goes to trainer.json, written by the checkpointer.
        if self._ddp is not None:
            # BatchNorm statistics drift apart between ranks within a step (DDP re-broadcasts rank 0's at the
            # next forward). DCP writes each replicated tensor from one rank only: make that rank 0's copy.
            for buffer in self.model.buffers():
                dist.broadcast(buffer, src=0)
        with single_process_ok():
            dcp.save(self._state(), checkpoint_id=str(step_dir), no_dist=not dist.is_initialized())

    def load(self, step_dir: Path) -> None:
        state = self._state()
        reader = SafeFileSystemReader(str(step_dir))
        reader.read_metadata()  # its own one line (inside dcp.load it would be one rank's failure among others)
        with single_process_ok(), reading(step_dir):
            dcp.load(state, storage_reader=reader, planner=WeightsOnlyLoadPlanner(), no_dist=not dist.is_initialized())
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) model weights, on CPU."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
