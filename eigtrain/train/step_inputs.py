"""One loader batch -> the engine's micro-batches: to the device, augmented into two views (or a pair), trimmed to
a multiple of the micro-batch count, split; how the views are handed over (`view_options`) and the loss function the
engine steps on them (`make_loss_fn`)."""

from __future__ import annotations

from typing import Any

import torch

from eigtrain.engine import chunks
from eigtrain.engine.base import LossFn
from eigtrain.train.skipped_batches import rows, stand_in


class StepInputs:
    """uint8 batch -> device -> augmented, normalized views (or pairs) -> (micro-batches, usable). A batch left with
    fewer than 2 samples per micro-batch by dropped corrupt samples is unusable: a stand-in of that size keeps this
    rank in step with the others, and every rank skips the update (`eigtrain.train.skipped_batches`)."""

    def __init__(
        self,
        augment: Any,
        generator: torch.Generator,
        device: torch.device,
        *,
        pairs: bool,
        accum: int,
        split_batch: bool,
        channels_last: bool,
    ):
        self.augment, self.generator, self.device, self.pairs = augment, generator, device, pairs
        self.accum, self.channels_last = accum, channels_last
        self.keep_multiple = accum * (2 if split_batch else 1)  # split-batch (even/odd) estimators: even sizes

    def __call__(self, batch: dict) -> tuple[list, bool]:
        accum, device, generator = self.accum, self.device, self.generator
        usable = rows(batch) - rows(batch) % self.keep_multiple >= 2 * accum
        batch = batch if usable else stand_in(batch, 2 * accum)
        if self.pairs:
            x, a = (batch[k].to(device, non_blocking=True) for k in ("x", "a"))
            first = self.augment.view(x, generator, 0)
            second = self.augment.view(a, generator, 1) if a.dtype == torch.uint8 else a
        else:
            sizes = batch.get("size")  # data.image_fit=whole: each image's valid region, crops come from all of it
            sizes = None if sizes is None else sizes.to(device, non_blocking=True)  # once for both views
            first, second = self.augment(batch["image"].to(device, non_blocking=True), generator=generator, sizes=sizes)
        keep = len(first) - len(first) % self.keep_multiple  # a batch shortened by dropped corrupt samples
        first, second = first[:keep], second[:keep]
        if self.channels_last and first.ndim == 4:
            first, second = (t.contiguous(memory_format=torch.channels_last) for t in (first, second))
        return list(zip(chunks(first, accum), chunks(second, accum))), usable


class AutocastEncode:
    """The encoder under the engine's autocast. Views: one forward over both (one pass through BatchNorm and the
    wrapper); pairs: phi(x), psi(a)."""

    def __init__(self, engine, pairs: bool):
        self.engine, self.pairs = engine, pairs

    def __call__(self, module, micro):
        first, second = micro
        with self.engine.autocast():
            return module(first, second) if self.pairs else module(torch.cat([first, second])).chunk(2)


def make_loss_fn(engine, objective, pairs: bool) -> LossFn:
    """loss_fn(module, (first, second)) for engine.train_step: encoder under autocast, objective in fp32
    (encode and objective apart, so that accumulation can evaluate the objective on the whole batch)."""
    return LossFn(AutocastEncode(engine, pairs), objective)


def view_options(data, engine) -> dict[str, Any]:
    """How the augmentation hands the views over on CUDA: compiled (data.augment_compile, null: on), in the encoder's
    autocast dtype and memory layout (what autocast and the encoder would make of them anyway). On the CPU: fp32,
    eager, as documented (bit-identical resume)."""
    if engine.device.type != "cuda":
        return {"compile": bool(data.augment_compile)}
    dtype = engine.autocast_dtype or torch.float32
    compile = True if data.augment_compile is None else bool(data.augment_compile)
    return {"compile": compile, "dtype": dtype, "channels_last": bool(engine.channels_last)}
