"""What both engines share: the step result, mixed precision policy, and the cross-rank finiteness vote."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

PRECISIONS = ("auto", "fp32", "bf16")

# loss_fn(model, micro_batch) -> (scalar loss, dict of detached terms). The model it gets is the
# engine's wrapped module (DDP / DeepSpeed / compiled), so gradients are synchronized correctly.
LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class StepResult:
    loss: torch.Tensor  # mean loss over the micro-batches (detached, 0-d)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_norm: float = float("nan")  # before clipping
    applied: bool = True  # False when a non-finite loss or gradient made the engine skip the update


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for the encoder, or None for plain fp32. ``auto`` means bf16 on GPU, fp32 on CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"engine.precision={precision!r} is not known; allowed: {', '.join(PRECISIONS)}")
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return torch.bfloat16 if precision == "bf16" else None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def all_ranks_true(flag: bool, device: torch.device) -> bool:
    """True only if ``flag`` is true on every rank, so all ranks take the same skip decision."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


class TermAverager:
    """Mean of loss terms over the micro-batches of one optimizer step."""

    def __init__(self) -> None:
        self.count = 0
        self.loss = torch.zeros(())
        self.terms: dict[str, torch.Tensor] = {}

    def add(self, loss: torch.Tensor, terms: dict[str, torch.Tensor]) -> None:
        self.count += 1
        self.loss = self.loss.to(loss.device) + loss.detach().float()
        for k, v in terms.items():
            v = v.detach().float()
            self.terms[k] = self.terms[k] + v if k in self.terms else v

    def mean(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = max(1, self.count)
        return self.loss / n, {k: v / n for k, v in self.terms.items()}


def chunks(batch: Any, n: int) -> Iterator[Any]:
    """Split a batch (tensor, or dict/tuple of tensors; other values are passed whole) into n micro-batches."""
    if n == 1:
        yield batch
        return
    for i in range(n):
        yield _take(batch, i, n)


def _take(x: Any, i: int, n: int) -> Any:
    if isinstance(x, torch.Tensor):
        return x.chunk(n)[i]
    if isinstance(x, dict):
        return {k: _take(v, i, n) for k, v in x.items()}
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return type(x)(_take(v, i, n) for v in x)
    return x
