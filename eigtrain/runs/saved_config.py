"""A run directory's saved ``config.yaml`` read as untrusted input: plain YAML only. OmegaConf's loader is a safe
one (a ``!!python/...`` tag never executes), but its refusal is a YAML traceback; here it is one line naming the
file, the line and the tag, as a `SavedConfigError` (a ValueError: every command reports it as such)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf


class SavedConfigError(ValueError):
    """A saved config that is not plain YAML of keys (a tag eigtrain never writes, a syntax error, a list)."""


def load_saved_config(path: str | os.PathLike) -> DictConfig:
    """`path` (a run's config.yaml) as an OmegaConf config, or `SavedConfigError` in one line naming it."""
    path = Path(path)
    try:
        cfg = OmegaConf.load(path)
    except yaml.YAMLError as exn:
        mark = getattr(exn, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exn, "problem", None) or str(exn).splitlines()[0]
        raise SavedConfigError(
            f"cannot read {path}{where}: {problem}; eigtrain writes plain YAML (no tags such as !!python), so this "
            f"file was changed or is not eigtrain's: nothing in it was run"
        ) from None
    if not isinstance(cfg, DictConfig):
        raise SavedConfigError(f"cannot read {path}: not a mapping of config keys, so not a config eigtrain wrote")
    return cfg
