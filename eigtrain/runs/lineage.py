"""What a step means: resuming a run with another objective, model, data source or schedule is refused.

A checkpoint's step N is N updates of *this* objective on *this* model over *this* data in *this* order with *this*
schedule; continuing it under another config would give a run that is neither. At resume the trainer compares the
`LINEAGE_KEYS` of the new config with the run's saved ``config.yaml`` (both with credentials redacted) and refuses a
change with one line naming the key, before anything is loaded or rewritten. ``new_lineage=true`` continues anyway
as a new lineage: the change (key, old and new value, the step it starts from) is appended to ``lineage.jsonl``.
Keys that only say how to run (workers, logging, checkpoint cadence, devices, the launcher) may change freely.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from eigtrain import safe_files
from eigtrain.runs.saved_config import load_saved_config

log = logging.getLogger("eigtrain.train.command")

LINEAGE_FILE = "lineage.jsonl"
LINEAGE_KEYS = (
    "objective",
    "nesting",
    "model",
    "optim",
    "dim",
    "batch_size",
    "steps",  # the learning-rate schedule spans them
    "seed",
    "engine.name",
    "engine.zero_stage",
    *(
        f"data.{key}"
        for key in (
            "root",
            "shards",
            "split",
            "mode",
            "image_size",
            "view_size",
            "resampled",
            "augment",
            "mean",
            "std",
            "image_key",
            "label_key",
            "x_key",
            "a_key",
            "image_fit",
            "shuffle_block",
            "mix_shards",
        )
    ),
)
_ABSENT = "<absent>"
# Settings added inside a lineage key after runs existed, with the value that does what the code did before them. A
# run saved before a setting has no such key; the same model under today's code has it at this value: the same
# lineage, so the compared value (and the identity's digest) leaves it out there. Any other value is a change.
SINCE_ADDED = {"model": {"pool": 1}}  # the tiny CNN's global average pool, before model.pool


def _value(cfg: DictConfig | ListConfig, key: str) -> Any:
    """The key's value, or _ABSENT where the saved config (an older run's) has no such key: a fact about the file
    compared as such, not a default standing in for a setting (except SINCE_ADDED's, which are left out)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_missing=False) if parent else cfg
    if not OmegaConf.is_dict(node) or leaf not in node:
        return _ABSENT
    value = OmegaConf.select(cfg, key, throw_on_missing=False)
    value = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if isinstance(value, dict) and key in SINCE_ADDED:
        value = {k: v for k, v in value.items() if k not in SINCE_ADDED[key] or v != SINCE_ADDED[key][k]}
    return value


def changes(saved: DictConfig | ListConfig, new: DictConfig) -> dict[str, tuple[Any, Any]]:
    """{key: (saved value, new value)} for every lineage key that differs."""
    return {k: (_value(saved, k), _value(new, k)) for k in LINEAGE_KEYS if _value(saved, k) != _value(new, k)}


KEY_FILE = ".eigtrain-key"  # the run's HMAC key (0600): identities compare unredacted values without storing them


def run_key(run_dir: Path, create: bool) -> bytes | None:
    """The run's identity key (made on its first save when `create`), None when there is none."""
    path = Path(run_dir) / KEY_FILE
    if path.is_file() and not path.is_symlink():
        return path.read_bytes()
    if not create:
        return None
    key = secrets.token_bytes(32)
    safe_files.write_bytes(path, key, file_mode=0o600)
    return key


def identity(cfg: DictConfig, key: bytes) -> dict[str, str]:
    """{lineage key: keyed digest of its unredacted value}: stored in every checkpoint (trainer.json), so a resume
    is checked against what the checkpoints were trained with even without config.yaml, and values that differ only
    in a credential or a query (`?set=a` vs `?set=b`, both REDACTED in config.yaml) still differ."""
    text = lambda k: json.dumps(_value(cfg, k), sort_keys=True, default=str).encode()  # noqa: E731
    return {k: hmac.new(key, text(k), hashlib.sha256).hexdigest()[:32] for k in LINEAGE_KEYS}


def saved_trainer_state(step_dir: Path) -> dict:
    """A checkpoint's trainer.json as a dict ({} when unreadable: the resume's own checks then say why)."""
    try:
        state = json.loads((Path(step_dir) / "trainer.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def identity_changes(run_dir: Path, saved: dict | None, new: DictConfig) -> list[str]:
    """The lineage keys whose value differs from the one the checkpoint (its trainer.json `identity`) was made with."""
    if not isinstance(saved, dict) or not saved:
        return []  # a checkpoint from before identities
    key = run_key(run_dir, create=False)
    if key is None:
        return ["(the run's identity key, " + KEY_FILE + ", is missing)"]
    now = identity(new, key)
    return [k for k in LINEAGE_KEYS if k in saved and saved[k] != now[k]]


def check_resume(
    run_dir: Path, new: DictConfig | dict, step: int, allow_new_lineage: bool, unredacted=None, saved_identity=None
) -> str:
    """'' when resuming `run_dir` at `step` under `new` (redacted as config.yaml is) continues the same lineage, or
    it may start a new one (recorded); else the one line refusing it. `unredacted` (the live config) is compared
    with the checkpoint's `saved_identity` too (`identity_changes`)."""
    saved_path = Path(run_dir) / "config.yaml"
    changed: dict[str, tuple[Any, Any]] = {}
    if saved_path.is_file():  # (a run from before config.yaml, or one whose file was removed: the identity below)
        try:
            saved = load_saved_config(saved_path)  # plain data: no tag, alias or interpolation is acted on
        except Exception as error:  # YAML errors of every kind: the refusal names the file
            return str(error).splitlines()[0] if str(error) else f"cannot read {saved_path}: {type(error).__name__}"
        changed = changes(saved, new if isinstance(new, DictConfig) else OmegaConf.create(new))
    if not changed and unredacted is not None:
        hidden = identity_changes(run_dir, saved_identity, unredacted)
        changed = {k: ("<as its checkpoints were trained>", "<another value>") for k in hidden}
    if not changed:
        return ""
    key, (old, value) = next(iter(changed.items()))
    more = f" (and {', '.join(list(changed)[1:])})" if len(changed) > 1 else ""
    if not allow_new_lineage:
        return (
            f"resuming {run_dir} at step {step} with {key} changed from {old!r} to {value!r}{more}: its checkpoints "
            f"are steps of the config saved in {saved_path}; give the saved value, another run_dir, or "
            f"new_lineage=true to continue from step {step} as a new lineage (recorded in {LINEAGE_FILE})"
        )
    record = {
        "step": step,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "changed": {k: list(v) for k, v in changed.items()},
    }
    with safe_files.open_append(Path(run_dir) / LINEAGE_FILE) as f:  # a planted link is refused, never followed
        f.write(json.dumps(record, default=str) + "\n")
    log.warning("new lineage from step %d: %s changed%s (recorded in %s)", step, key, more, LINEAGE_FILE)
    return ""
