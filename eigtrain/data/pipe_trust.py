"""`pipe:CMD` shard sources run the shell command CMD. A run directory's saved ``config.yaml`` is untrusted input
(as its checkpoints are, loaded with ``weights_only=True``): a `pipe:` source read back from it runs only when
the user named that source on the command line (``data.shards=pipe:...``), or passed ``data.allow_pipe=true``
there. A saved config's own ``allow_pipe`` is not a permission: the decision is the command line's.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from eigtrain.data.shards import expand_shards, scheme

SOURCE_KEYS = ("shards", "val_shards", "shard_index")  # data keys eigtrain opens as URLs


class PipeNotAllowed(ValueError):
    """A `pipe:` source read back from a saved config, not allowed on the command line."""


def runs_command(url) -> bool:
    """Whether opening `url` runs a shell command (webdataset's gopen runs every ``pipe:`` URL, any case)."""
    return scheme(str(url).strip()) == "pipe"


def _urls(value) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else [str(v) for v in value]
    try:
        return expand_shards(items)  # `{pipe:CMD,a.tar}` hides a command inside a pattern
    except ValueError:
        return items


def check_saved_sources(data, keys: Collection[str], given: Collection[str], allow_pipe: bool, config: Path) -> None:
    """Refuse (`PipeNotAllowed`, one line naming the key and how to allow it) when a data key of `keys` read back
    from the saved `config` names a `pipe:` source; keys in `given` came from the command line."""
    if allow_pipe:
        return
    for key in keys:
        if key not in given and any(runs_command(u) for u in _urls(data.get(key))):
            raise PipeNotAllowed(
                f"data.{key} in {config} is a pipe: source, which runs a shell command; eigtrain does not run "
                f"commands read back from a run's files: pass data.{key}=... on the command line, or "
                f"data.allow_pipe=true to run the saved one"
            )
