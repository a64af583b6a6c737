"""Whose weights an export was solved on: eigtrain-eval scores a run's embeddings through its own export only.

eigtrain-rr records the sha256 of the weights it read (the run's model.safetensors, or every file of a checkpoint
step) in the export's manifest (``source.sha256``). eigtrain-eval compares it with the weights it embeds with and
refuses another run's export -- or the same run's from another step -- with one line, unless
``allow_foreign_export=true``, which the report then states.
"""

from __future__ import annotations

import json
from pathlib import Path


def export_provenance(rr_dir: Path, weights: Path, weights_sha256: str | None, allow_foreign: bool) -> dict:
    """The export's provenance for the report; ValueError (one line) when it is not of `weights` and not allowed."""
    manifest_path = Path(rr_dir) / "manifest.json"
    try:
        source = json.loads(manifest_path.read_text()).get("source") or {}
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"cannot read {manifest_path}: {error}") from None
    recorded = source.get("sha256") if isinstance(source, dict) else None
    matches = recorded is not None and recorded == weights_sha256
    info = {
        "export": str(rr_dir),
        "solved_on": source.get("path") if isinstance(source, dict) else None,
        "solved_on_sha256": recorded,
        "scored_weights": str(weights),
        "scored_weights_sha256": weights_sha256,
        "same_weights": matches,
        "allow_foreign_export": allow_foreign,
    }
    if not matches and not allow_foreign:
        what = "records no weights hash" if recorded is None else f"was solved on other weights ({source.get('path')})"
        raise ValueError(
            f"the Rayleigh-Ritz export {rr_dir} {what}, not on the weights scored here ({weights}): its features would "
            f"not be this run's; run eigtrain-rr on this run, or pass allow_foreign_export=true to use it anyway "
            f"(stated in the report)"
        )
    return info


def provenance_line(info: dict) -> str:
    """The report's line on the export's weights (markdown)."""
    if info["same_weights"]:
        return f"Rayleigh-Ritz export {info['export']}: solved on the weights scored ({info['scored_weights']})."
    return (
        f"Rayleigh-Ritz export {info['export']}: solved on OTHER weights ({info['solved_on']}), not the ones scored "
        f"({info['scored_weights']}); used because allow_foreign_export=true."
    )
