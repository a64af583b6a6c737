"""Steps whose batch has too few usable samples (all corrupt, or a single one): skipped by every rank, then counted.

A rank whose batch is unusable still takes part in the step, on a stand-in batch of the same shape, with its
embeddings poisoned (`eigtrain.engine.base.accumulated_backward(usable=False)`): the objective's all-reduce and the
gradient all-reduce carry the NaN to every rank, so every rank's guarded update skips that step. The agreement rides
on collectives every step makes anyway: an ordinary step gains no collective and no host synchronisation. Only
when the host reads the skip counter (logging and checkpoint steps) do the ranks tell each other which steps were
theirs (`agreed_count`), so that unusable batches and non-finite losses are counted apart.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def rows(batch: dict) -> int:
    """Usable samples in a loader batch (corrupt ones are already dropped)."""
    return len(batch["image"] if "image" in batch else batch["x"])


def stand_in(batch: dict, n: int) -> dict:
    """A batch of ``n`` samples shaped like ``batch``: its samples repeated, or zeros (whole images) if it has none."""
    have = rows(batch)
    out = dict(batch)
    for name, value in batch.items():
        if not (isinstance(value, torch.Tensor) and value.ndim >= 1 and len(value) == have):
            continue
        if have:
            out[name] = value[torch.arange(n) % have]
        elif name == "size":  # data.image_fit=whole: the valid region of a zero image is all of it
            out[name] = torch.tensor(batch["image"].shape[-2:], dtype=value.dtype).repeat(n, 1)
        else:
            if 0 in value.shape[1:]:
                raise RuntimeError(
                    f"a batch without a usable sample has no known {name!r} shape to stand in "
                    f"for it; set data.image_size"
                )
            out[name] = torch.zeros((n, *value.shape[1:]), dtype=value.dtype)
    return out


def agreed_count(local_steps: list[int]) -> int:
    """How many distinct steps any rank listed (a collective: call on every rank at the same step)."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return len(set(local_steps))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(set(local_steps)))
    return len(set().union(*everyone))
