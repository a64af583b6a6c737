"""A run's wandb run, opened the one way the trainer (metrics_log) and eigtrain-rr (rr_wandb) both open it: the
run's stable id resumed, in the run directory, the command line and config redacted of credentials."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from eigtrain.redact import redact_config, redacted_argv
from eigtrain.schema import WandbConfig


def import_wandb(mode: str, why_missing: str) -> Any:
    """The wandb module, or None when mode is disabled or wandb is not installed (a warning saying `why_missing`:
    the offline GPU machine has none)."""
    if mode == "disabled":
        return None
    try:
        import wandb
    except ImportError:
        logging.getLogger(__name__).warning("logging.wandb.mode=%s but wandb is not installed: %s", mode, why_missing)
        return None
    return wandb


def open_run(wandb: Any, cfg: WandbConfig, run_id: str, run_dir: Path, config: Mapping[str, Any] | None = None):
    """wandb.init for the run `run_id` (resumed when it exists) under `run_dir`."""
    with redacted_argv():  # wandb records the command line and the config: neither with credentials
        return wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            id=run_id,
            resume="allow",
            mode=cfg.mode,
            dir=str(run_dir),
            config=None if config is None else redact_config(config),
        )
