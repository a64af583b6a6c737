"""StreamOptions: how a ShardStream reads, splits and batches its shards, typed, with each default written once.

The source (``root``, an eigtrain shard directory, or ``shards``, any webdataset shards) is the stream's own
argument; everything else is here. A bad value fails when the options are made, with one line naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .decode import FITS
from .shards import DEFAULT_TIMEOUT_S

MODES = ("views", "pairs")


@dataclass(frozen=True)
class StreamOptions:
    split: str = "train"  # the split to read: of root's index, or the one the foreign shards hold
    batch_size: int = 64  # samples per batch, per rank
    rank: int = 0  # this rank; the split across ranks and workers depends only on these options
    world_size: int = 1  # ranks reading the split together
    num_workers: int = 2  # DataLoader workers; 0 reads in the calling process (as one worker)
    seed: int = 0  # shard order and shuffles are seeded by (seed, restart, epoch)
    mode: str = "views"  # "views": one image per sample; "pairs": x and a per sample
    image_size: int | tuple[int, int] | None = None  # bring every image to (H, W) in the workers; None: as stored
    resampled: bool = False  # draw shards with replacement (a nominal epoch of num_samples)
    one_pass: bool = False  # read every sample exactly once across ranks and workers (evaluation, Rayleigh-Ritz)
    max_corrupt: int = 10  # unusable samples skipped with a warning before CorruptDataError
    shuffle_block: int = 1000  # undecoded samples each worker shuffles together (0 or 1: shard order only)
    pin_memory: bool = False  # passed to the DataLoader
    prefetch_factor: int = 2  # passed to the DataLoader
    persistent_workers: bool = False  # passed to the DataLoader
    image_key: str | list[str] | None = None  # foreign shards, views: member-name alternatives (jpg;jpeg;png;webp)
    label_key: str | None = None  # foreign shards: "cls", "json:FIELD" or None (label -1)
    x_key: str | list[str] | None = None  # foreign shards, pairs: the x member (x.*)
    a_key: str | list[str] | None = None  # foreign shards, pairs: the a member (a.*; an .npy member is a vector)
    image_fit: str = "cover"  # "cover": resize and center-crop; "whole": fit inside, pad, add the valid "size"
    mix_shards: int = 8  # shards each worker reads side by side (class-ordered shards still give mixed batches)
    cache_dir: str | os.PathLike | None = None  # foreign shards: where a one-time count scan is cached
    shard_index: str | None = None  # foreign shards: a wids index giving the sample counts
    io_timeout_s: float = DEFAULT_TIMEOUT_S  # bound on every network read
    jpeg_device: object = None  # decode JPEG batched in the main process on this device (nvJPEG); None: workers
    shards_key: str = "data.shards"  # the config key naming foreign shards, for messages

    def __post_init__(self):
        # One line per bad value, before any shard is opened or any worker started.
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.max_corrupt < 0:
            raise ValueError(f"max_corrupt must be >= 0, got {self.max_corrupt}")
        if self.one_pass and self.resampled:
            raise ValueError("one_pass=True reads every sample exactly once; it cannot be combined with resampled=True")
        if self.image_fit not in FITS:
            raise ValueError(f"image_fit must be one of {FITS}, got {self.image_fit!r}")
        if self.image_fit == "whole" and self.mode == "pairs":
            raise ValueError("image_fit='whole' needs mode='views' (stored pairs are used as they are: use 'cover')")
        if self.mix_shards < 1:
            raise ValueError(f"mix_shards must be >= 1, got {self.mix_shards}")
        if self.jpeg_device is not None and self.mode != "views":
            raise ValueError("jpeg_device (batched JPEG decoding) needs mode='views'")
        object.__setattr__(self, "image_size", _as_size(self.image_size))  # one form, (H, W), from here on


def _as_size(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be None, an int or (H, W), got {size}")
    return size
