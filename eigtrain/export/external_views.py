"""eigtrain-rr's path for any model over image shards (encoder=timm:NAME | module:pkg.mod:factory): two augmented
views per image, one pass, normalized as eigtrain-train would normalize them (eigtrain.data.normalization)."""

from __future__ import annotations

import sys
from pathlib import Path

from eigtrain.data import ShardStream, build_augment, read_index
from eigtrain.data.from_config import split_shards
from eigtrain.data.normalization import Stated, decide
from eigtrain.export.embed import reduce_views
from eigtrain.export.moments import RRAccumulator
from eigtrain.runs.checksums import file_sha256
from eigtrain.schema import DataConfig


def reduce_external(cfg, env, device):
    """The eigtrain-rr path for any model (encoder=timm:NAME | module:pkg.mod:factory) over image shards: two
    views per image from the augmentation preset data.augment, one pass (see eigtrain.export.command)."""
    from eigtrain.export.external_encoder import build_external_encoder, check_embedding, embedding_dim
    from eigtrain.models.pretrained import file_normalization

    data, spec = cfg.data, cfg.encoder.name
    stream, expected, meta = _external_stream(cfg, env)
    channels = int(meta.get("channels", 3))
    view_size = data.view_size or data.image_size or tuple(meta.get("image_shape", (0, 0, 0))[1:]) or None
    if not view_size:
        raise ValueError("data.image_size is needed: these shards do not state their image size")
    view_size = (view_size, view_size) if isinstance(view_size, int) else tuple(view_size)
    stated = file_normalization(cfg.encoder.checkpoint)  # what the weights say, else the preset's (as eigtrain-train)
    norm, warning = decide(data.augment, data.mean, data.std, channels, Stated(*stated) if stated else None)
    if warning and env.rank == 0:
        print(f"eigtrain-rr: {warning}", file=sys.stderr)
    model = build_external_encoder(
        spec, cfg.encoder.checkpoint, dict(cfg.encoder.kwargs), in_chans=channels, seed=cfg.seed
    ).to(device)
    dim = embedding_dim(model, spec, (channels, *view_size), device)  # fails on a bad output before any data is read
    augment = build_augment(data.augment, image_size=view_size, **norm.kwargs()).to(device)
    encode = lambda x: check_embedding(model(x), spec, len(x))  # noqa: E731
    acc = reduce_views(encode, stream, augment, RRAccumulator(dim, device=device, folds=cfg.folds), device, cfg.seed)
    weights = cfg.encoder.checkpoint
    source = {
        "kind": "encoder",
        "encoder": spec,
        "kwargs": dict(cfg.encoder.kwargs),
        "checkpoint": str(Path(weights).resolve()) if weights else None,
        "init_seed": None if weights else cfg.seed,
        "sha256": file_sha256(weights) if weights and env.rank == 0 else None,
        "data": {
            k: _plain(getattr(data, k))
            for k in ("root", "shards", "val_shards", "augment", "image_size", "image_fit", "view_size", "mean", "std")
        },
        "normalization": norm.record(),  # the mean/std used (data.mean/std, else the weights', else the preset's)
    }
    return acc, expected, source


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _external_stream(cfg, env) -> tuple[ShardStream, int, dict]:
    """One-pass stream over data.root (eigtrain shards; count from the index) or data.shards (any webdataset
    shards; counts from a shard index or one scan, see eigtrain.data.sample_counts): (stream, samples, meta)."""
    data, index = cfg.data, None
    keys = ("root", "image_size", "image_fit", "max_corrupt", "image_key", "label_key", "shard_index", "io_timeout_s")
    read = DataConfig(split=cfg.split, mode="views", num_workers=cfg.num_workers, **{k: getattr(data, k) for k in keys})
    key = "data.shards"
    if data.root:
        index = read_index(data.root)
        read.num_workers = min(cfg.num_workers, len(index.shards(cfg.split)) // env.world_size)
    else:
        key, shards = split_shards(DataConfig(shards=data.shards, val_shards=data.val_shards), cfg.split)
        read.shards = list(shards) if isinstance(shards, (list, tuple)) else shards
    stream = ShardStream(
        read,
        batch_size=cfg.batch_size,
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.seed,
        one_pass=True,
        cache_dir=data.cache_dir,
        shards_key=key,
    )
    if index is not None:
        return stream, index.num_samples(cfg.split), index.meta
    return stream, stream.num_samples, {"channels": 3}
