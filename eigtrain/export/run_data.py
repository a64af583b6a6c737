"""The data keys a command applies to a trained run (eigtrain-rr, -eval, -embed): a light module, so that a
command reading embedding files imports no image stack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RunDataConfig:
    """The command line's data sources for the runs read by eigtrain-rr, -eval and -embed
    (None: each run's saved config.yaml)."""

    shards: Any = None  # shard pattern(s) or list; with a run, they replace its saved data.shards
    val_shards: Any = None  # replaces the run's data.val_shards: the held-out shards scored as split val
    shard_index: str | None = None  # a wids index of the shards' sample counts
    label_key: str | None = None  # the labels of those shards (cls | json:FIELD), e.g. a data.root run's by pattern
    allow_pipe: bool = False  # run pipe: sources read back from a run's saved config.yaml
