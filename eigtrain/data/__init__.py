"""Data: tar shards and their index, the streaming pipeline with its exact-resume cursor, batched augmentation.

Data flows one way: `write_shards` (CLI ``eigtrain-shards``) or any webdataset shards (`eigtrain.data.shards`)
-> `ShardStream` (decode only, in workers) ->
device -> `build_augment` (random views, per-sample parameters) -> encoder.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names are, for type checkers; at run time they load on first use (below)
    from eigtrain.data.augment import BatchAugment, build_augment
    from eigtrain.data.augment_recipes import ViewRecipe
    from eigtrain.data.decode import Corrupt
    from eigtrain.data.index import ShardIndex, read_index
    from eigtrain.data.sample_counts import shard_counts
    from eigtrain.data.shards import ShardError, expand_shards
    from eigtrain.data.sources import cifar10_source, digits_source, imagefolder_source, npz_source
    from eigtrain.data.stream import CorruptDataError, ShardStream
    from eigtrain.data.write import write_shards

# name -> the module that defines it, imported on first use (PEP 562): `eigtrain.data.augment_recipes` and the
# other torch-free modules load without torch, so a command checks its config before torch is imported
_HOMES = {
    "BatchAugment": "augment",
    "build_augment": "augment",
    "ViewRecipe": "augment_recipes",
    "Corrupt": "decode",
    "ShardIndex": "index",
    "read_index": "index",
    "shard_counts": "sample_counts",
    "ShardError": "shards",
    "expand_shards": "shards",
    "cifar10_source": "sources",
    "digits_source": "sources",
    "imagefolder_source": "sources",
    "npz_source": "sources",
    "CorruptDataError": "stream",
    "ShardStream": "stream",
    "write_shards": "write",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'eigtrain.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"eigtrain.data.{_HOMES[name]}"), name)


__all__ = [
    "BatchAugment",
    "Corrupt",
    "CorruptDataError",
    "ShardError",
    "ShardIndex",
    "ShardStream",
    "ViewRecipe",
    "build_augment",
    "expand_shards",
    "shard_counts",
    "cifar10_source",
    "digits_source",
    "imagefolder_source",
    "npz_source",
    "read_index",
    "write_shards",
]
