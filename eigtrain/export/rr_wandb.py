"""The Rayleigh-Ritz spectrum in the training run's wandb run: eigtrain-rr on a run directory resumes the run's
wandb id (its config's logging.wandb: mode, project, entity; its `wandb_id` file) and logs the exported spectrum as
its own curve, eigenvalue against feature index (`rr/spectrum`), with `rr/eigenvalue/NNN` (NNN = feature, largest
first) in the run's summary. The training curves `eigenvalue/NNN` are something else: coordinate NNN's live estimate
during training, in the encoder's coordinate order (docs/configs.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from eigtrain.runs.saved_config import load_saved_config
from eigtrain.runs.wandb_run import import_wandb, open_run
from eigtrain.schema import LoggingConfig, typed

SUMMARY_EIGENVALUES = 64  # rr/eigenvalue/NNN in the summary; the whole spectrum is in the curve and the manifest


def spectrum_record(wandb: Any, eigenvalues: Sequence[float], step: int | None) -> tuple[dict, dict]:
    """(what wandb.log takes, what goes in the summary) for the exported spectrum (descending)."""
    values = [float(v) for v in eigenvalues]
    table = wandb.Table(columns=["feature", "eigenvalue"], data=[[i, v] for i, v in enumerate(values, 1)])
    title = "Rayleigh-Ritz spectrum" + (f" (checkpoint step {step})" if step is not None else "")
    curve = wandb.plot.line(table, "feature", "eigenvalue", title=title)
    summary = {f"rr/eigenvalue/{i:03d}": v for i, v in enumerate(values[:SUMMARY_EIGENVALUES], 1)}
    return {"rr/spectrum": curve}, {**summary, "rr/features": len(values), "rr/step": step}


def log_rr_spectrum(source: dict[str, Any], eigenvalues: Sequence[float]) -> bool:
    """Log the spectrum to the wandb run of `source`'s run (a checkpoint source); False when there is none to log
    to: not a run, wandb disabled in its config, no `wandb_id`, or wandb not installed."""
    if source.get("kind") != "checkpoint":
        return False
    run_dir = Path(source["run_dir"])
    id_file = run_dir / "wandb_id"
    saved = load_saved_config(run_dir / "config.yaml")
    wandb_cfg = typed(LoggingConfig, saved.logging if "logging" in saved else {}).wandb  # the schema's defaults
    mode = wandb_cfg.mode
    if mode == "disabled" or not id_file.is_file() or id_file.is_symlink():
        return False
    wandb = import_wandb(mode, "the Rayleigh-Ritz spectrum is not logged")
    if wandb is None:
        return False
    run = open_run(wandb, wandb_cfg, id_file.read_text()[:64].strip(), run_dir)
    logged, summary = spectrum_record(wandb, eigenvalues, source.get("step"))
    run.log(logged)
    run.summary.update(summary)
    run.finish()
    return True
