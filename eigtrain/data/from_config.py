"""The ``data`` config group -> checks, shard preparation and the ShardStream of a training run.

check_data(cfg.data, world_size, per_rank_batch)      # cheap, also on a login node before submission
x_shape, a_shape = prepare_data(cfg.data, rank, cache_dir=run_dir / "data", barrier=dist.barrier)
stream = build_stream(cfg.data, batch_size=..., rank=..., world_size=..., seed=..., device=device,
                      cache_dir=run_dir / "data")
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from eigtrain.data.decode import FITS
from eigtrain.data.gpu_decode import DECODE_CHOICES, choose_jpeg_device
from eigtrain.data.index import INDEX_NAME, read_index
from eigtrain.data.sample_counts import known_counts, shard_counts
from eigtrain.data.shards import expand_shards, local_path
from eigtrain.data.stream import ShardStream
from eigtrain.data.stream_checks import listed
from eigtrain.redact import redact_url
from eigtrain.schema import DataConfig


class DataConfigError(ValueError):
    """A data config that cannot work; the message names the key, the numbers and the fix."""


def _listed(value: Any) -> Any:
    """A config value that is a string, None or a list (ListConfig) -> str, None or list[str]."""
    return listed(value)


def uses_shards(data: DataConfig) -> bool:
    return bool(data.shards)


NO_SOURCE = "give data.root (an eigtrain shard directory) or data.shards (a pattern or list)"


def data_root(data: DataConfig) -> Path:
    """data.root of a config without data.shards; a `DataConfigError` when neither is given."""
    if data.root is None:
        raise DataConfigError(NO_SOURCE)
    return Path(data.root)


VAL_SPLIT = "val"
NO_VAL_SHARDS = (
    "split 'val' of data trained from data.shards needs held-out shards: give data.val_shards=PATTERN "
    "(a pattern or list, read like data.shards); the training shards are never scored as validation"
)


def split_shards(data: DataConfig, split: str) -> tuple[str, Any]:
    """(key, shards) of `split` in a data.shards config: its training split (data.split) is data.shards, split
    'val' is data.val_shards, held out from data.shards. Anything else is a `DataConfigError` naming the key."""
    if split == data.split:
        return "data.shards", data.shards
    if split != VAL_SPLIT:
        raise DataConfigError(
            f"split {split!r} does not exist for data.shards: data.shards is split "
            f"{data.split!r} and data.val_shards split {VAL_SPLIT!r}"
        )
    if not data.val_shards:
        raise DataConfigError(NO_VAL_SHARDS)
    shared = set(expand_shards(_listed(data.shards))) & set(expand_shards(_listed(data.val_shards)))
    if shared:
        raise DataConfigError(
            f"data.val_shards shares {len(shared)} shard(s) with data.shards, e.g. "
            f"{redact_url(min(shared))}: validation shards must be held out from training"
        )
    return "data.val_shards", data.val_shards


def split_source(data: DataConfig, split: str) -> str:
    """Where `split` comes from, for reports (URLs without credentials): the key and its pattern, or the
    split of the eigtrain shard directory."""
    if not uses_shards(data):
        return f"split {split!r} of data.root={data.root}"
    key, shards = split_shards(data, split)
    shards = _listed(shards)
    return f"{key}={redact_url(shards) if isinstance(shards, str) else [redact_url(s) for s in shards]}"


def check_data(data: DataConfig, world_size: int, per_rank_batch: int) -> None:
    """Key values, and the data against the job where it is cheap to know (local files, an existing index)."""
    if data.image_fit not in FITS:
        raise DataConfigError(f"data.image_fit={data.image_fit!r} is not allowed; allowed: {', '.join(FITS)}")
    if data.decode not in DECODE_CHOICES:
        raise DataConfigError(f"data.decode={data.decode!r} is not allowed; allowed: {', '.join(DECODE_CHOICES)}")
    for key, low in (("mix_shards", 1), ("prefetch_factor", 1), ("shuffle_block", 0), ("num_workers", 0)):
        value = getattr(data, key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise DataConfigError(f"data.{key} must be an integer >= {low}, got {value!r}")
    if uses_shards(data):
        if data.image_size is None and data.view_size is None:
            raise DataConfigError(
                "data.shards needs data.image_size (images of any size are brought to it in the "
                "workers; image_fit=whole keeps the whole image for the random crops)"
            )
        urls = expand_shards(_listed(data.shards))
        for key, listed in (("data.shards", urls), ("data.val_shards", _val_urls(data))):
            missing = [u for u in listed if (p := local_path(u)) is not None and not p.is_file()]
            if missing:
                raise DataConfigError(
                    f"{len(missing)} of the {len(listed)} shards of {key} do not exist, e.g. {missing[0]}"
                )
        try:  # counts from an index only (never a scan here); without one the stream checks at start-up
            counts = known_counts(urls, data.shard_index, float(data.io_timeout_s))
        except (OSError, ValueError, KeyError):
            return
        if all(u in counts for u in urls):
            _check_batches(sum(counts[u] for u in urls), "data.shards", data, world_size, per_rank_batch)
        return
    if data.val_shards:
        raise DataConfigError(
            "data.val_shards goes with data.shards; with data.root the validation data is the split 'val' of its index"
        )
    root = data_root(data)
    if not (root / INDEX_NAME).is_file():
        return  # written later (write_if_missing) or reported by the stream with the command that writes it
    _check_batches(
        read_index(root).num_samples(data.split), f"split {data.split!r} of {root}", data, world_size, per_rank_batch
    )


def _val_urls(data: DataConfig) -> list[str]:
    """The URLs of data.val_shards (checked held out from data.shards); none when it is not set."""
    return expand_shards(_listed(split_shards(data, VAL_SPLIT)[1])) if data.val_shards else []


def check_splits(data: DataConfig, splits) -> None:
    """Each of `splits` exists for this data config (cheap: no shard is read); `DataConfigError` naming the key."""
    if uses_shards(data):
        for split in splits:
            split_shards(data, split)


def _check_batches(samples: int, where: str, data: DataConfig, world_size: int, per_rank_batch: int) -> None:
    workers = max(int(data.num_workers), 1)
    if samples // (world_size * workers) < per_rank_batch:
        raise DataConfigError(
            f"{where} has {samples} samples, fewer than one batch per reader slot: world_size x num_workers x "
            f"per-rank batch = {world_size} x {workers} x {per_rank_batch}; lower data.num_workers or batch_size"
        )


def prepare_data(
    data: DataConfig, rank: int, cache_dir: Path | None = None, barrier: Callable[[], None] = lambda: None
):
    """Shapes of the model's inputs (x_shape, a_shape or None). Rank 0 goes first: it writes a demo data set
    when configured (into an empty or new directory only, never over a user's data) or counts the samples of
    foreign shards once (cached in `cache_dir`); the other ranks then read what it wrote."""
    if uses_shards(data):
        if rank == 0:
            shard_counts(expand_shards(_listed(data.shards)), cache_dir, data.shard_index, float(data.io_timeout_s))
        barrier()
        shape = data.view_size or data.image_size
        assert shape is not None  # check_data: data.shards needs data.image_size
        x_shape = (3, *map(int, shape))
        return x_shape, (x_shape if data.mode == "pairs" else None)
    root = data_root(data)
    if not (root / INDEX_NAME).exists() and data.write_if_missing:
        if rank == 0:
            _write_demo(data.write_if_missing, data.shard_size, root)
        barrier()
    index = read_index(root)
    meta, size = index.meta, data.view_size or data.image_size or index.meta["image_shape"][1:]
    # image-folder shards have no fixed image_shape (null), only channels
    x_shape = (int(meta["channels"] if "channels" in meta else meta["image_shape"][0]), *map(int, size))
    if data.mode == "views":
        return x_shape, None
    return x_shape, (tuple(meta["a_shape"]) if meta.get("a_kind") == "vector" else x_shape)  # index.json's meta


def _write_demo(source: str, shard_size: int, root: Path) -> None:
    from eigtrain.data import write_marker

    try:
        write_marker.clear_interrupted(root)  # eigtrain's own write, killed midway: written again
    except FileExistsError as exn:  # its writer may still run, or a file of someone else's lies beside it
        raise DataConfigError(f"data.root={root}: {exn}") from None
    if root.exists() and any(root.iterdir()):
        raise DataConfigError(
            f"data.root={root} has files but no {INDEX_NAME}: data.write_if_missing={source} only writes "
            f"the demo shards into a new or empty directory, never into a directory that holds other data. For "
            f"webdataset shards written by other tools use data.shards='{root}/<name>-{{000000..000099}}.tar' "
            f"(and data.write_if_missing=null)"
        )
    from eigtrain.data.write import WriteArgs, check_args, write_source

    write_source(check_args(asdict(WriteArgs(source=source, out=str(root), shard_size=shard_size))))


def build_stream(
    data: DataConfig,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    device: torch.device,
    cache_dir: Path | None = None,
    split: str | None = None,
    num_workers: int | None = None,
    one_pass: bool = False,
    channels: int = 3,
) -> ShardStream:
    """The training stream of the `data` config on `device` (pinned memory and nvJPEG decoding follow it); with
    `one_pass`, every sample of `split` exactly once across ranks and workers (embedding, Rayleigh-Ritz).
    `channels`: what images of data.shards are decoded to (data.root's shards state their own)."""
    device = torch.device(device)
    split, key = split or data.split, "data.shards"
    pin = device.type == "cuda" if data.pin_memory is None else bool(data.pin_memory)
    changes: dict[str, Any] = dict(split=split, resampled=data.resampled and not one_pass, pin_memory=pin)
    if num_workers is not None:
        changes["num_workers"] = num_workers
    if uses_shards(data):
        key, shards = split_shards(data, split)
        changes["shards"] = _listed(shards)
    jpeg = choose_jpeg_device(data.decode, device, data.image_size) if data.mode == "views" else None
    return ShardStream(
        dataclasses.replace(data, **changes),
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        seed=seed,
        one_pass=one_pass,
        cache_dir=cache_dir,
        jpeg_device=jpeg,
        shards_key=key,
        channels=channels,
    )
