"""Which weights of a run the commands read: its final weights as the trainer recorded them, else the newest
checkpoint that verifies, pinned while read and chosen again when a live trainer prunes it meanwhile."""

from __future__ import annotations

import logging
from pathlib import Path

from eigtrain.runs.checkpoint import EXPORT_NAME, read_encoder
from eigtrain.runs.checkpoint_verify import newest_verified, recorded_mismatch

log = logging.getLogger("eigtrain.export.embed")


def read_newest(run: Path, step: Path | None, retry: bool, attempts: int = 5):
    """(encoder, weights sha256, step read): `step`, pinned while read; when a live trainer prunes it between the
    choice and the read (keep_last=1, a save every step), the newest step again (`retry`), a few times."""
    from eigtrain.runs.checkpoint_read import CheckpointReadError

    for attempt in range(attempts):
        try:
            return (*read_encoder(run, step), step)
        except CheckpointReadError as error:
            if not retry or step is None or "pruned" not in str(error) or attempt == attempts - 1:
                raise
            log.info("%s was pruned while being chosen; taking the newest step again", step)
            step, _ = final_or_newest(run)
    raise AssertionError("unreachable")


def final_or_newest(run: Path) -> tuple[Path | None, str]:
    """(None, '') for the run's final weights (model.safetensors as the trainer recorded it), else the newest
    checkpoint that verifies, with a warning naming the final weights' problem; one line when neither is usable."""
    problem = recorded_mismatch(run, EXPORT_NAME) if (run / EXPORT_NAME).exists() else f"no {EXPORT_NAME}"
    if not problem:
        return None, ""
    step = newest_verified(run / "checkpoints")
    if step is None:
        raise FileNotFoundError(f"{run}: {problem}, and no complete checkpoint verifies")
    if (run / EXPORT_NAME).exists():
        log.warning("%s; using the newest checkpoint that verifies, %s", problem, step)
    return step, problem
