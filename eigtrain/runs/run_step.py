"""Which training step a command's weights come from: the final export (`model.safetensors`, its metadata's step)
or a checkpoint directory (`step-N`). Commands print it and record it, so a score of an unfinished run says so."""

from __future__ import annotations

import json
import re
from pathlib import Path

_STEP = re.compile(r"step-(\d+)$")


def weights_step(weights: str | Path) -> int | None:
    """The step of a run's weights: a checkpoint directory's N, the export's recorded step; None if unknown."""
    weights = Path(weights)
    if weights.is_dir():
        found = _STEP.match(weights.name)
        return int(found.group(1)) if found else None
    try:
        from safetensors import safe_open

        with safe_open(str(weights), "pt") as f:
            step = json.loads((f.metadata() or {}).get("step", "null"))
        return step if isinstance(step, int) else None
    except Exception:  # an export from before, or unreadable here: the load itself reports a damaged file
        return None


def describe(weights: str | Path, step: int | None, steps: int | None) -> str:
    """'step N of S (the final export model.safetensors)' / 'step N of S (checkpoint DIR; the run has not
    finished)': which weights a command used, for its output."""
    weights = Path(weights)
    of = f"step {step if step is not None else '?'}" + (f" of {steps}" if steps else "")
    if weights.is_dir() or _STEP.match(weights.name):
        unfinished = "; the run has not finished" if step is not None and steps and step < steps else ""
        return f"{of} (checkpoint {weights}{unfinished})"
    return f"{of} (the final export {weights.name})"


def weights_record(run) -> dict:
    """Which step of `run` (an `eigtrain.export.embed.TrainedRun`) a command uses, for its manifest or report: run_dir,
    weights, step, steps (the run's configured total)."""
    steps = run.cfg.steps  # every saved config has it (TrainConfig.steps)
    return {"run_dir": str(run.run_dir), "weights": str(run.weights), "step": weights_step(run.weights), "steps": steps}
