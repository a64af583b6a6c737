"""What the training loop carries from step to step, and the checkpoint keeps.

`TrainState` (the same on every rank, ``trainer.json``): the step, the samples seen, the skipped updates -- for a
non-finite loss or gradient, or for a batch without enough usable samples (`eigtrain.train.skipped_batches`) -- and the
wandb run id. Skipped updates accumulate in a device counter that the host reads (one synchronisation) only at
steps where some component is due (logging, checkpoint, stop), so an ordinary step never waits for the GPU.
`RankState` (``rank-R.pt``): this rank's data cursor and random state.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import torch

from eigtrain.train import random_state
from eigtrain.train.skipped_batches import agreed_count

log = logging.getLogger("eigtrain.train.command")  # the trainer's warnings, under the trainer's name in the run's log


class NonFiniteError(RuntimeError):
    """Too many steps with a non-finite loss or gradient."""


class TrainState:
    def __init__(self, device: torch.device, *, batch_size: int, max_nonfinite_steps: int):
        self.step = self.samples = self.skipped_steps = self.skipped_batches = 0
        self.wandb_id: str | None = None
        self.identity: dict[str, str] | None = None  # what the steps are steps of (eigtrain.runs.lineage.identity)
        self.batch_size, self.max_nonfinite_steps = batch_size, max_nonfinite_steps
        self._unread_skips = torch.zeros((), dtype=torch.int64, device=device)  # skipped updates not yet read
        self._unusable_steps: list[int] = []  # this rank's steps on a stand-in batch since the last read

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "samples": self.samples,
            "skipped_steps": self.skipped_steps,
            "skipped_batches": self.skipped_batches,
            "wandb_id": self.wandb_id,
            "identity": self.identity,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """A checkpoint's ``trainer.json``; a key it lacks (an older checkpoint's) keeps its start value."""
        for key in self.state_dict():
            setattr(self, key, state.get(key, getattr(self, key)))

    def advance(self, applied: torch.Tensor | bool, usable: bool) -> int:
        """Count one step of ``batch_size`` samples whose update was ``applied`` (kept on the device, not read) on a
        ``usable`` batch; returns the new step."""
        if not usable:
            self._unusable_steps.append(self.step + 1)
        self._unread_skips += ~torch.as_tensor(applied, device=self._unread_skips.device)
        self.step, self.samples = self.step + 1, self.samples + self.batch_size
        return self.step

    def read_skips(self, last_checkpoint: Any) -> None:
        """Read the skip counter (one host synchronisation) and count the skips since the last read, apart: unusable
        batches on any rank (a collective when there were skips: call on every rank at the same step), then
        non-finite updates; NonFiniteError (naming ``last_checkpoint``) past max_nonfinite_steps."""
        skips = int(self._unread_skips.item())
        if not skips:  # the same on every rank: an unusable batch on any rank made every rank skip
            return
        self._unread_skips.zero_()
        unusable = agreed_count(self._unusable_steps)
        self._unusable_steps.clear()
        if unusable:
            self.skipped_batches += unusable
            log.warning(
                "step %d: %d step(s) skipped since the last check for a batch without enough usable samples "
                "on some rank (%d so far; data.max_corrupt bounds the unusable samples)",
                self.step,
                unusable,
                self.skipped_batches,
            )
        if skips == unusable:
            return
        self.skipped_steps += skips - unusable
        log.warning(
            "step %d: non-finite loss or gradient, %d update(s) skipped since the last check (%d so far)",
            self.step,
            skips - unusable,
            self.skipped_steps,
        )
        if self.skipped_steps > self.max_nonfinite_steps:
            raise NonFiniteError(
                f"{self.skipped_steps} steps had a non-finite loss or gradient, more than "
                f"max_nonfinite_steps={self.max_nonfinite_steps}; stopped at step {self.step}; last good checkpoint: "
                f"{last_checkpoint}"
            )


class RankState:
    """This rank's own resumable state: the data cursor of ``stream`` and every RNG, ``generator`` (the
    augmentation's) included."""

    def __init__(self, stream: Any, generator: torch.Generator):
        self.stream, self.generator = stream, generator

    def state_dict(self) -> dict[str, Any]:
        return {"rng": random_state.rng_state({"augment": self.generator}), "data": self.stream.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stream.load_state_dict(state["data"])
        if "rng" in state:  # absent after a resume on another world size (`Checkpointer.load`)
            random_state.set_rng_state(state["rng"], {"augment": self.generator})
