"""A run directory's saved ``config.yaml`` read as untrusted input: plain data, never code or a computation.

- Plain YAML only (a ``!!python/...`` tag never executes): the refusal is one line naming the file, the line and
  the tag, as a `SavedConfigError` (a ValueError: every command reports it as such).
- No YAML aliases: eigtrain writes none (its configs are resolved into fresh containers before they are written),
  and nested aliases are how a 2 KB file expands to gigabytes (nine levels hung eigtrain-rr).
- The file must be the one eigtrain wrote: its sha256 is recorded in the run's ``checksums.json`` when it is written,
  and a config.yaml changed since (an edit, a truncation) is refused in one line naming it. (The record guards
  against accidents, not against someone who can also rewrite ``checksums.json``: the checks above hold anyway.)
- No interpolation is ever resolved: a value that calls a resolver (``${oc.env:AWS_SECRET_ACCESS_KEY}``,
  ``${oc.decode:...}``) is refused in one line naming the key, and a plain ``${NAME}`` (a shell variable in a pipe:
  command, written escaped on the command line) stays those characters, for the shell. ``???`` (a value never
  given) is refused naming its key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from eigtrain.runs.checkpoint_verify import recorded_mismatch

MAX_BYTES = 4 << 20  # a saved config is a few kilobytes
_RESOLVER = re.compile(r"\$\{[^}]*:")  # ${name:...}: a resolver call


class SavedConfigError(ValueError):
    """A saved config that is not plain YAML of keys (a tag eigtrain never writes, a syntax error, a list)."""


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"a YAML alias (*{event.anchor}): eigtrain writes none", event.start_mark
            )
        return super().compose_node(parent, index)


def _as_data(value: Any, path: Path, key: str = "") -> Any:
    """`value` with every string kept literal (OmegaConf would resolve ``${...}`` on access)."""
    if isinstance(value, dict):
        return {k: _as_data(v, path, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_data(v, path, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):
        if _RESOLVER.search(value):
            raise SavedConfigError(
                f"{path}: {key} calls a resolver ({value[:60]!r}); a saved config is data, never resolved: give "
                f"{key}=... on the command line"
            )
        if value == "???":
            raise SavedConfigError(f"{path}: {key} has no value (???): give {key}=... on the command line")
        return value.replace("${", "\\${")  # OmegaConf reads an escaped ${ as those two characters
    return value


def load_saved_config(path: str | os.PathLike) -> DictConfig:
    """`path` (a run's config.yaml) as an OmegaConf config of plain values, or `SavedConfigError` in one line."""
    path = Path(path)
    if path.name == "config.yaml" and (problem := recorded_mismatch(path.parent, path.name)):
        raise SavedConfigError(f"{problem}: the run's settings are read only from the config.yaml it wrote")
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_BYTES + 1)
        if len(text) > MAX_BYTES:
            raise SavedConfigError(f"cannot read {path}: over {MAX_BYTES >> 20} MiB, not a config eigtrain wrote")
        data = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exn:
        mark = getattr(exn, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exn, "problem", None) or str(exn).splitlines()[0]
        raise SavedConfigError(
            f"cannot read {path}{where}: {problem}; eigtrain writes plain YAML (no tags such as !!python, no "
            f"aliases), so this file was changed or is not eigtrain's: nothing in it was run"
        ) from None
    if not isinstance(data, dict):
        raise SavedConfigError(f"cannot read {path}: not a mapping of config keys, so not a config eigtrain wrote")
    cfg = OmegaConf.create(_as_data(data, path))
    assert isinstance(cfg, DictConfig)
    return cfg
