"""Data: tar shards and their index, the streaming pipeline with its exact-resume cursor, batched augmentation.

Data flows one way: `write_shards` (CLI ``eigtrain-shards``) or any webdataset shards (`eigtrain.data.shards`)
-> `ShardStream` (decode only, in workers) ->
device -> `build_augment` (random views, per-sample parameters) -> encoder.
"""

from eigtrain.data.augment import BatchAugment, build_augment
from eigtrain.data.augment_recipes import ViewRecipe
from eigtrain.data.decode import Corrupt
from eigtrain.data.index import ShardIndex, read_index
from eigtrain.data.sample_counts import shard_counts
from eigtrain.data.shards import ShardError, expand_shards
from eigtrain.data.sources import cifar10_source, digits_source, imagefolder_source, npz_source
from eigtrain.data.stream import CorruptDataError, ShardStream
from eigtrain.data.write import write_shards

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
