"""Every random number generator a process draws from: seeding from (run seed, rank), and saving and restoring
their states in a checkpoint's ``rank-R.pt`` (bit-identical resume)."""

from __future__ import annotations

import logging
import random
from typing import Any, Mapping

import numpy as np
import torch

log = logging.getLogger(__name__)


def seed_all(*entropy: int) -> int:
    """Seed python, numpy and torch from the given integers (e.g. run seed and rank); returns the seed."""
    seed = int(np.random.SeedSequence(list(entropy)).generate_state(1)[0])
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    return seed


def rng_state(generators: Mapping[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every RNG this process draws from, in a form ``torch.load(weights_only=True)`` accepts."""
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the global MT19937's legacy state (a dict only for other bit generators)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(_plain, np_state[2:])),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # This process's own GPU only: a requeued job may see another number of GPUs per task.
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    for name, gen in (generators or {}).items():
        state[f"generator.{name}"] = gen.get_state()
    return state


def set_rng_state(state: Mapping[str, Any], generators: Mapping[str, torch.Generator] | None = None) -> None:
    random.setstate(_as_tuple(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if isinstance(cuda, (list, tuple)):  # older checkpoints: every visible GPU's state; take this process's own
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
        cuda = cuda[index] if index < len(cuda) else None
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda, torch.cuda.current_device())
    elif cuda is not None:
        log.warning("the checkpoint holds a CUDA random state but no GPU is visible: resuming on CPU, not exactly")
    for name, gen in (generators or {}).items():
        gen.set_state(state[f"generator.{name}"])


def _plain(x: Any) -> Any:
    return x.item() if isinstance(x, np.generic) else x


def _as_tuple(x: Any) -> Any:
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
