"""Shards that other tools wrote (webdataset's writers, jpg + cls): class-ordered shards, single samples,
a quiet HTTP handler to serve them from 127.0.0.1, and the overrides of a tiny training run over them."""

import http.server
import io
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

CLASSES, PER_CLASS = 6, 24  # 144 samples; shard i holds class i only (class-ordered, as many real data sets)
PATTERN = "cls-{000000..000005}.tar"


def jpeg(index: int, rng) -> bytes:
    """A JPEG of random size (12..40 px a side) whose top-left pixel block encodes the sample's index."""
    h, w = rng.integers(12, 41, 2)
    image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_class_ordered(directory: Path, classes=CLASSES, per_class=PER_CLASS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(directory / "cls-%06d.tar"), maxcount=per_class, verbose=0) as sink:
        for c in range(classes):
            for i in range(per_class):
                sink.write({"__key__": f"c{c}-{i:03d}", "jpg": jpeg(c * per_class + i, rng), "cls": c})
    return directory


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def train_overrides(run_dir, shards, *extra):
    return [
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.shards='{shards}'",
        "data.image_size=[16,16]",
        "data.image_fit=whole",
        "data.label_key=cls",
        "data.augment=cifar",
        "data.num_workers=2",
        "data.shuffle_block=10",
        "batch_size=16",
        "steps=6",
        "checkpoint_every=3",
        "log_every=1",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        *extra,
    ]


def write_shard(path: Path, samples: list[dict]) -> Path:
    with wds.TarWriter(str(path)) as sink:
        for sample in samples:
            sink.write(sample)
    return path


def good_samples(prefix, n, rng=None):
    rng = rng or np.random.default_rng(1)
    return [{"__key__": f"{prefix}-{i:02d}", "jpg": jpeg(i, rng), "cls": i % 3} for i in range(n)]


# Labelled train and val shards of one class set (data.val_shards)
LABELLED_CLASSES, TRAIN_PER_CLASS, VAL_PER_CLASS = 4, 16, 6
N_TRAIN, N_VAL = LABELLED_CLASSES * TRAIN_PER_CLASS, LABELLED_CLASSES * VAL_PER_CLASS


def write_shards(directory: Path, prefix: str, per_class: int, seed: int, per_shard: int) -> str:
    """Class-labelled JPEG shards `prefix-000000.tar`, ... (keys `prefix-c-i`); returns their brace pattern."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(str(directory / f"{prefix}-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for c in range(LABELLED_CLASSES):
            for i in range(per_class):
                sink.write({"__key__": f"{prefix}-{c}-{i:03d}", "jpg": jpeg(i, rng), "cls": c})
    last = (LABELLED_CLASSES * per_class - 1) // per_shard
    return str(directory / f"{prefix}-{{000000..{last:06d}}}.tar")
