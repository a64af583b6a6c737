"""ShardStreams for the tests: keyword arguments split between the data config (eigtrain.schema.DataConfig) and the
stream's own (batch_size, rank, world_size, seed, one_pass, cache_dir, jpeg_device, shards_key)."""

import dataclasses
import os

from eigtrain.data import ShardStream
from eigtrain.schema import DataConfig

DATA_KEYS = {f.name for f in dataclasses.fields(DataConfig)}
# What these tests were written with (two workers, 64 per batch, seed 0), where a test does not say.
TEST_SETTINGS = {"num_workers": 2, "batch_size": 64, "seed": 0}


def open_stream(root: str | os.PathLike | None = None, **kw) -> ShardStream:
    """The stream of `root` (an eigtrain shard directory) or of `shards=...` (foreign shards)."""
    kw = {**TEST_SETTINGS, **kw}
    data = {k: v for k, v in kw.items() if k in DATA_KEYS}
    if root is not None:
        data["root"] = str(root)
    return ShardStream(DataConfig(**data), **{k: v for k, v in kw.items() if k not in DATA_KEYS})
