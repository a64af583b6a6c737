"""What both engines share: the step result, mixed precision, the exact accumulated backward, the guarded update.

Gradient accumulation is exact for every objective (the global-batch estimate the README promises), by
gradient caching: the objective is a function of the embeddings of the whole per-rank batch (and, through its
all-reduce, of the global batch), so
  1. encode every micro-batch without a graph (BatchNorm running statistics restored afterwards),
  2. evaluate the objective once on the concatenated embeddings and back-propagate to them: dL/dz,
  3. encode each micro-batch again with a graph, replaying the random state of step 1 (the same dropout /
     drop-path masks, so the graph forward recomputes exactly the embeddings of step 1), and back-propagate
     dL/dz_i through the encoder.
The summed parameter gradients equal the gradient of the objective on the whole batch, whatever the objective
(moments, normalization, centering, even/odd split halves, per-sample terms). The cost is one extra forward
pass without a graph; the memory is that of one micro-batch plus the (batch x d) embeddings.
What this does not make exact: train-mode BatchNorm in the encoder normalizes each micro-batch by its own
statistics, as with any accumulation (`accumulation_caveat`).

Nothing here reads a tensor back to the host: the non-finite check is a device flag that makes the optimizer
update a no-op (`guarded_step`), so a step costs no host synchronisation.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from eigtrain.objectives.moments import set_matmul_tf32

PRECISIONS = ("auto", "fp32", "bf16")

Encode = Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor]]
Objective = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class LossFn:
    """encode(module, micro_batch) -> (z1, z2) (the encoder, under autocast); objective(z1, z2) -> (loss, terms)
    in fp32. The module it gets is the engine's wrapped one (DDP / DeepSpeed / compiled)."""

    encode: Encode
    objective: Objective

    def __call__(self, module: nn.Module, micro_batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        z1, z2 = self.encode(module, micro_batch)
        return self.objective(z1.float(), z2.float())


@dataclass
class StepResult:
    loss: torch.Tensor  # the objective on the whole (global) batch (detached, 0-d, on the device)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    grad_norm: torch.Tensor | float = float("nan")  # before clipping (a device tensor: read it at logging steps)
    # False when a non-finite loss or gradient made the engine skip the update: a 0-d bool device tensor, so that
    # the trainer reads it only when it has to (logging and checkpoint steps), not once per step.
    applied: torch.Tensor | bool = True


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


def enable_cuda_fast_paths(deterministic: bool = False) -> None:
    """TF32 tensor cores for fp32 convolutions and matmuls, and cuDNN autotuning (fixed input shapes).

    The objective keeps full fp32 matmuls in its forward pass (`eigtrain.objectives.moments.full_fp32_matmul`),
    so losses and the logged eigenvalue estimates are not TF32-rounded.

    deterministic (engine.deterministic): no autotuning and only deterministic kernels. Autotuning times the
    candidate kernels again in every process, so a resumed process may pick other convolution algorithms than
    the uninterrupted one did: its fp32 losses then differ in the 5th digit (1.8e-5 relative on an H200)."""
    set_matmul_tf32(True)
    torch.backends.cudnn.allow_tf32 = True  # the legacy flag: readable by Inductor whatever the torch version
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
        torch.use_deterministic_algorithms(True, warn_only=True)  # an op without such a kernel warns, not fails


def use_channels_last(setting: bool | None, model: nn.Module, device: torch.device | str) -> bool:
    """engine.channels_last; null: on for a convolutional backbone (more than a ViT's one patch-embedding
    convolution) trained on CUDA, where cuDNN's NHWC kernels make bf16 ResNets 10-30 % faster; off on the CPU
    and for MLPs and ViTs, which have nothing to gain."""
    if setting is not None:
        return bool(setting)
    convolutions = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    return torch.device(device).type == "cuda" and convolutions > 1


# -- the accumulated backward --------------------------------------------------------------------------------
def accumulation_caveat(model: nn.Module, accum: int) -> str | None:
    """Why accumulating ``accum`` micro-batches is not the whole-batch step for this model, or None."""
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    if accum <= 1 or not norms:
        return None
    return (
        f"gradient accumulation ({accum} micro-batches) with {'/'.join(norms)} in the encoder: each micro-batch "
        f"is normalized by its own statistics, so the step differs from one whole-batch step (the objective's "
        f"batch statistics stay exact); for exact accumulation use a model without BatchNorm"
    )


def _rng_snapshot() -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random state dropout / drop-path draw from: the CPU generator's, and this process's GPU's if in use.
    (Both live on the host: no device synchronisation.)"""
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _rng_restore(snapshot: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    cpu, cuda = snapshot
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


@contextlib.contextmanager
def buffers_restored(model: nn.Module):
    """Undo in-place buffer updates (BatchNorm running statistics) made inside the block."""
    buffers = [b for b in model.buffers() if b is not None]
    saved = [b.detach().clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)


def accumulated_backward(
    module: nn.Module,
    model: nn.Module,
    micro_batches: list[Any],
    loss_fn: LossFn,
    backward: Callable[[torch.Tensor, int], None],
    sync_context: Callable[[int], contextlib.AbstractContextManager] = lambda i: contextlib.nullcontext(),
    usable: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward/backward over the micro-batches; returns the (detached) global-batch loss and terms.

    module: what to call (wrapped); model: the plain module (its buffers); backward(tensor, i): the engine's
    backward of micro-batch i's scalar; sync_context(i): e.g. DDP's no_sync for all but the last micro-batch.
    One micro-batch: the plain forward + backward. Several: gradient caching (module docstring).
    usable=False: the micro-batches only stand in for a batch this rank could not use; its embeddings become NaN,
    which the all-reduces carry to every rank, so every rank skips the update (`eigtrain.train.skipped_batches`), and
    this rank's BatchNorm statistics stay as they were.
    """
    if not usable:
        with buffers_restored(model):
            return accumulated_backward(module, model, micro_batches, _poisoned(loss_fn), backward, sync_context)
    if len(micro_batches) == 1:
        with sync_context(0):
            loss, terms = loss_fn(module, micro_batches[0])
            backward(loss, 0)
        return loss.detach(), {k: v.detach() for k, v in terms.items()}

    if not isinstance(loss_fn, LossFn):
        raise TypeError("gradient accumulation needs a LossFn (encode + objective), not a plain loss function")
    rng = []  # each micro-batch's random state before its graph-free forward, replayed for its graph forward
    with torch.no_grad(), buffers_restored(model):
        embedded = []
        for mb in micro_batches:
            rng.append(_rng_snapshot())
            embedded.append(loss_fn.encode(module, mb))
    after = _rng_snapshot()
    z1, z2 = (torch.cat([z[side] for z in embedded]).float().requires_grad_() for side in (0, 1))
    sizes = [len(z[0]) for z in embedded]
    del embedded
    loss, terms = loss_fn.objective(z1, z2)
    dz1, dz2 = torch.autograd.grad(loss, (z1, z2), allow_unused=True)
    dz1, dz2 = (torch.zeros_like(z) if d is None else d for d, z in ((dz1, z1), (dz2, z2)))
    # A non-finite loss must never be applied even if its gradient happens to be finite.
    poison = torch.where(torch.isfinite(loss.detach()), 1.0, float("nan"))
    for i, (mb, g1, g2) in enumerate(zip(micro_batches, dz1.split(sizes), dz2.split(sizes))):
        _rng_restore(rng[i])
        with sync_context(i):
            a, b = loss_fn.encode(module, mb)
            surrogate = ((a.float() * g1).sum() + (b.float() * g2).sum()) * poison
            backward(surrogate, i)
    _rng_restore(after)  # as after the graph-free pass (the same draws): the random stream advanced once per step
    return loss.detach(), {k: v.detach() for k, v in terms.items()}


def _poisoned(loss_fn: LossFn) -> LossFn:
    def encode(module: nn.Module, micro_batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(z * float("nan") for z in loss_fn.encode(module, micro_batch))  # type: ignore[return-value]

    return LossFn(encode, loss_fn.objective)


# -- the guarded update --------------------------------------------------------------------------------------
def guarded_step(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """``optimizer.step()`` that changes nothing (parameters, optimizer state) where ``ok`` is False, decided on
    the device: no host synchronisation.

    A fused SGD / Adam / AdamW (torch's, as on CUDA) skips inside its kernel, given ``found_inf`` as AMP's grad
    scaler does (`fused_skip_step`): no copy at all. Any other optimizer: one copy of the parameters and optimizer
    state per step, made and selected as one flat buffer per (device, dtype): a handful of kernel launches whatever
    the number of parameters (a clone and a `where` per tensor made small models launch-bound).

    State created by this step (first step: momentum buffers, Adam moments) is reset to zeros, which for SGD,
    LARS and AdamW is exactly the state before the first update."""
    if not fused_skip_step(optimizer, ok):
        flat_guarded_step(optimizer, ok)


def flat_guarded_step(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> None:
    """`guarded_step` by one flat copy of the parameters and state per (device, dtype), selected after the step."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    before = _step_tensors(optimizer, params)
    saved = {group: torch.cat([_flat(before[k]) for k in keys]) for group, keys in _grouped(before).items()}
    optimizer.step()
    after = _step_tensors(optimizer, params)
    with torch.no_grad():
        for (device, dtype), keys in _grouped(after).items():
            old = saved.get((device, dtype))
            if old is None or keys != _grouped(before).get((device, dtype)):  # this step created state
                old = _previous(keys, before, after, saved.get((device, dtype)))
            targets = [_flat(after[k]) for k in keys]
            merged = torch.cat(targets)
            torch.where(ok if ok.device == device else ok.to(device), merged, old, out=merged)
            torch._foreach_copy_(targets, list(merged.split([t.numel() for t in targets])))


def fused_skip_step(optimizer: torch.optim.Optimizer, ok: torch.Tensor) -> bool:
    """The guarded step of torch's fused SGD / Adam / AdamW: their kernels leave parameters and state untouched where
    ``found_inf`` is 1 (Adam's step count is put back). SGD's momentum buffers are made zeros before its first step,
    so that a skipped first step leaves zeros (the fused kernel's first step would leave them uninitialized) and a
    first update gives ``0 * momentum + grad``: the first step's ``buf = grad``, bit for bit (no dampening).
    False (nothing done) for any other optimizer."""
    if not optimizer.defaults.get("fused") or not isinstance(optimizer, (torch.optim.SGD, torch.optim.Adam)):
        return False
    if isinstance(optimizer, torch.optim.SGD):
        for group in optimizer.param_groups:
            if group["momentum"] and group["dampening"]:
                return False  # a zero buffer is not the first step's buf = grad with dampening
            for p in group["params"]:
                if group["momentum"] and p.grad is not None and "momentum_buffer" not in optimizer.state[p]:
                    optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    # found_inf is no declared attribute of torch's optimizers: their fused step reads it with getattr.
    setattr(optimizer, "found_inf", (~ok).to(torch.float32))
    try:
        optimizer.step()
    finally:
        delattr(optimizer, "found_inf")
    return True


def _step_tensors(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> dict[tuple, torch.Tensor]:
    """What a step may change: each parameter and the tensors of its optimizer state, by (position, name)."""
    out = {}
    for i, p in enumerate(params):
        out[(i, "")] = p.detach()
        for name, v in optimizer.state.get(p, {}).items():
            if torch.is_tensor(v):
                out[(i, name)] = v
    return out


def _grouped(tensors: dict[tuple, torch.Tensor]) -> dict[tuple, list[tuple]]:
    groups: dict[tuple, list[tuple]] = {}
    for key, t in tensors.items():
        groups.setdefault((t.device, t.dtype), []).append(key)
    return groups


def _previous(keys: list[tuple], before: dict, after: dict, saved: torch.Tensor | None) -> torch.Tensor:
    """The flat pre-step values of `keys` in the group's new layout: zeros for state this step created."""
    pieces = {}
    if saved is not None:
        grouped = _grouped(before)[(saved.device, saved.dtype)]
        pieces = dict(zip(grouped, saved.split([before[k].numel() for k in grouped])))
    return torch.cat([pieces[k] if k in pieces else torch.zeros_like(_flat(after[k])) for k in keys])


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-d view of every element of a dense tensor, in memory order (channels_last included)."""
    if t.is_contiguous():
        return t.view(-1)
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda s: s[1]):
        if size != 1 and stride != expected:
            raise ValueError(f"guarded_step needs dense parameters and state, got strides {t.stride()}")
        expected *= size
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


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
