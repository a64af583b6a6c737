"""The checks a ShardStream makes of its arguments before any shard is opened or any worker started.

A stream takes the schema's data dataclass (eigtrain.schema.DataConfig: each key's default written once, there)
plus what the job decides (batch size, rank, world size, seed, one pass); a bad value is one line naming it.
"""

from __future__ import annotations

from eigtrain.data.decode import FITS
from eigtrain.schema import DataConfig

MODES = ("views", "pairs")


def check_stream(
    data: DataConfig, batch_size: int, ranks: tuple[int, int], seed: int, one_pass: bool, jpeg: bool
) -> None:
    """ValueError naming the first bad value; `ranks`: (rank, world_size); `jpeg`: nvJPEG decoding asked for."""
    rank, world_size = ranks
    if not data.shards and data.root is None:
        raise ValueError("give data.root (an eigtrain shard directory) or data.shards (a pattern or list)")
    if data.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {data.mode!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if data.num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {data.num_workers}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if data.max_corrupt < 0:
        raise ValueError(f"max_corrupt must be >= 0, got {data.max_corrupt}")
    if data.max_image_pixels < 1:
        raise ValueError(f"data.max_image_pixels must be >= 1, got {data.max_image_pixels}")
    if one_pass and data.resampled:
        raise ValueError("one_pass=True reads every sample exactly once; it cannot be combined with resampled=True")
    if data.image_fit not in FITS:
        raise ValueError(f"image_fit must be one of {FITS}, got {data.image_fit!r}")
    if data.image_fit == "whole" and data.mode == "pairs":
        raise ValueError("image_fit='whole' needs mode='views' (stored pairs are used as they are: use 'cover')")
    if data.mix_shards < 1:
        raise ValueError(f"mix_shards must be >= 1, got {data.mix_shards}")
    if jpeg and data.mode != "views":
        raise ValueError("jpeg_device (batched JPEG decoding) needs mode='views'")


def as_size(size: int | list[int] | tuple[int, ...] | None) -> tuple[int, int] | None:
    """image_size in one form, (H, W), from here on."""
    if size is None:
        return None
    if isinstance(size, int):
        size = (size, size)
    pair = tuple(int(s) for s in size)
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"image_size must be None, an int or (H, W), got {size}")
    return (pair[0], pair[1])


def listed(value: object) -> str | list[str] | None:
    """A config value that is a string, None or a list -> str, None or list[str]."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]  # type: ignore[attr-defined]
