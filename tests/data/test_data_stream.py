"""ShardStream on shards the tests write: coverage per epoch, equal batch counts per rank, one pass, resampling,
the errors that must come before training, corrupt samples and truncated tars."""

import collections
import inspect
import logging
import re

import numpy as np
import pytest
import torch

from eigtrain.data import CorruptDataError, ShardStream, read_index, write_shards
from eigtrain.data.sources import npz_source, png_bytes
from eigtrain.schema import DataConfig
from tests.support.streams import DATA_KEYS, open_stream

META = dict(mode="views", channels=1, image_shape=[1, 4, 4], labels=True)
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


def toy_samples(n, corrupt=()):
    """Sample i: key toy-iiiii, 4x4 grayscale image whose pixels encode i, label i % 10."""
    for i in range(n):
        image = np.full((4, 4), i % 256, np.uint8)
        image[0, 0] = i // 256
        yield {"__key__": f"toy-{i:05d}", "png": b"not a png" if i in corrupt else png_bytes(image), "cls": i % 10}


def write_toy(root, n, shard_size, corrupt=()):
    write_shards(root, {"train": toy_samples(n, corrupt)}, shard_size=shard_size, meta=META)
    return root


def decoded_index(batch):
    image = batch["image"].long()
    return (image[:, 0, 0, 0] * 256 + image[:, 0, 1, 1]).tolist()


def epoch_keys(root, world, **kw):
    """Keys of the first epoch of every rank, and each rank's batch count."""
    keys, counts = [], []
    for rank in range(world):
        stream = open_stream(root, rank=rank, world_size=world, **kw)
        batches = [b for _, b in zip(range(stream.batches_per_epoch), stream)]
        counts.append((stream.batches_per_epoch, len(batches)))
        keys += [k for b in batches for k in b["key"]]
        for b in batches:  # the content is the sample the key names
            assert decoded_index(b) == [int(k[4:]) for k in b["key"]]
            assert b["label"].tolist() == [int(k[4:]) % 10 for k in b["key"]]
    return keys, counts


@pytest.mark.slow
def test_two_ranks_two_workers_read_every_sample_exactly_once_per_epoch(tmp_path):
    root = write_toy(tmp_path, n=96, shard_size=12)  # 8 shards; 96 = 2 ranks x 2 workers x 4 batches x 6
    keys, counts = epoch_keys(root, world=2, batch_size=6, num_workers=2, seed=1)
    assert counts == [(8, 8), (8, 8)]
    assert sorted(keys) == [f"toy-{i:05d}" for i in range(96)]

    stream = open_stream(root, batch_size=6, rank=0, world_size=2, num_workers=2, seed=1)
    two_epochs = [b["key"] for _, b in zip(range(16), stream)]
    assert sorted(sum(two_epochs[8:], [])) != sorted(sum(two_epochs[:8], []))  # epoch 2 is reshuffled
    assert stream.epoch == 2


@pytest.mark.slow
def test_uneven_shards_still_give_equal_batch_counts_and_no_duplicates(tmp_path):
    root = write_toy(tmp_path, n=101, shard_size=12)  # 8 shards of 12 and one of 5
    keys, counts = epoch_keys(root, world=2, batch_size=6, num_workers=2, seed=0)
    assert counts == [(8, 8), (8, 8)]
    assert len(keys) == len(set(keys)) == 96  # 5 left out this epoch: fewer than one global batch (24)


@pytest.mark.slow
def test_one_pass_reads_every_sample_once_with_short_last_batches(tmp_path):
    root = write_toy(tmp_path, n=101, shard_size=12)
    keys, per_rank = [], []
    for rank in range(2):
        stream = open_stream(root, batch_size=8, rank=rank, world_size=2, num_workers=2, one_pass=True)
        batches = list(stream)  # finite
        assert len(batches) == stream.batches_per_epoch
        per_rank.append([len(b["key"]) for b in batches])
        keys += [k for b in batches for k in b["key"]]
    assert sorted(keys) == [f"toy-{i:05d}" for i in range(101)]
    assert all(n == 8 for sizes in per_rank for n in sizes[:-2]) and min(sum(per_rank, [])) < 8


def test_fewer_shards_than_reader_slots_share_shards_and_resampled_is_reproducible(tmp_path):
    root = write_toy(tmp_path, n=40, shard_size=20)  # 2 shards < 4 ranks x 1 worker: split below shard granularity
    keys, counts = epoch_keys(root, world=4, batch_size=4, num_workers=0, seed=0)
    assert counts == [(2, 2)] * 4 and len(keys) == len(set(keys)) == 32
    runs = []
    for _ in range(2):
        options = dict(batch_size=4, rank=1, world_size=2, num_workers=0, resampled=True, seed=3)
        stream = open_stream(root, **options)
        runs.append([b["key"] for _, b in zip(range(2 * stream.batches_per_epoch), stream)])
    assert runs[0] == runs[1] and all(len(keys) == 4 for keys in runs[0])


def test_failures_before_training_starts(tmp_path):
    with pytest.raises(FileNotFoundError, match="no shard index"):
        open_stream(tmp_path)
    root = write_toy(tmp_path / "d", n=20, shard_size=5)
    with pytest.raises(ValueError, match="split 'val' is not in .*available: \\['train'\\]"):
        open_stream(root, split="val")
    with pytest.raises(ValueError, match="views data but the stream was asked for mode='pairs'"):
        open_stream(root, mode="pairs", num_workers=0)
    with pytest.raises(ValueError, match="fewer than one batch per worker"):
        open_stream(root, batch_size=8, world_size=2, num_workers=2)
    (root / "train-000002.tar").unlink()
    with pytest.raises(FileNotFoundError, match="train-000002.tar .* does not exist"):
        open_stream(root, num_workers=0)
    empty = tmp_path / "empty"
    write_shards(empty, {"train": []}, meta=META)
    with pytest.raises(ValueError, match="split 'train' .* has no samples"):
        open_stream(empty)


def test_the_stream_takes_the_schemas_data_config_and_the_jobs_own_arguments(tmp_path):
    """The stream's settings are the schema's DataConfig (each default written once, there) plus the job's batch
    size, ranks and seed; a bad value fails when the stream is made, one line naming it, before any shard is read."""
    parameters = list(inspect.signature(ShardStream.__init__).parameters)
    assert parameters[:3] == ["self", "data", "batch_size"] and not set(parameters) & DATA_KEYS - {"data"}
    root = write_toy(tmp_path, n=20, shard_size=5)
    data = DataConfig(root=str(root), num_workers=0, image_size=[4, 4])
    stream = ShardStream(data, batch_size=4, seed=0)
    assert stream.image_size == (4, 4) and stream.batch_size == 4 and stream.num_workers == DataConfig.num_workers - 1
    assert ShardStream(DataConfig(root=str(root)), batch_size=4, seed=0).num_workers == DataConfig.num_workers
    for bad, match in [
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(rank=2, world_size=2), "rank < world"),
        (dict(image_fit="stretch"), "image_fit must be one of"),
        (dict(mode="x"), "mode must be one"),
        (dict(one_pass=True, resampled=True), "cannot be combined"),
        (dict(image_size=(4,)), "[H, W]"),
        (dict(mode="pairs", jpeg_device="cpu"), "jpeg_device"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            open_stream(tmp_path / "nothing-read-before-the-check", **bad)
    with pytest.raises(ValueError, match="give data.root"):
        ShardStream(DataConfig(), batch_size=4, seed=0)
    with pytest.raises(TypeError):
        ShardStream(data, batch_sise=4, seed=0)  # a misspelt setting is an error, not a silently ignored keyword


def test_image_size_resizes_and_crops_in_the_workers(tmp_path):
    shapes = [(6, 10), (12, 8), (5, 5)]
    samples = [{"__key__": f"k{i}", "png": png_bytes(np.full(s, 100, np.uint8))} for i, s in enumerate(shapes * 4)]
    write_shards(tmp_path, {"train": samples}, shard_size=12, meta=dict(mode="views", channels=3, labels=False))
    batch = next(iter(open_stream(tmp_path, batch_size=6, num_workers=0, image_size=4)))
    assert batch["image"].shape == (6, 3, 4, 4) and batch["image"].dtype == torch.uint8
    assert (batch["image"] == 100).all() and (batch["label"] == -1).all()
    with pytest.raises(ValueError, match="set image_size"):
        next(iter(open_stream(tmp_path, batch_size=6, num_workers=0)))


@pytest.mark.parametrize("a_kind", ["vector", "image"])
def test_pairs_mode_batches_from_npz_shards(tmp_path, a_kind):
    rng = np.random.default_rng(0)
    x = np.arange(12, dtype=np.uint8)[:, None, None, None] * np.ones((1, 8, 8, 3), np.uint8)  # x[i] == i
    a = rng.normal(size=(12, 5)) if a_kind == "vector" else x[:, None, :6, :6, 0]  # gray 6x6, also == i
    np.savez(tmp_path / "pairs.npz", x=x, a=a)
    source = npz_source(tmp_path / "pairs.npz", val_fraction=0)
    write_shards(tmp_path / "shards", source.splits, shard_size=6, meta=source.meta)
    batch = next(iter(open_stream(tmp_path / "shards", batch_size=4, num_workers=0, mode="pairs")))
    assert batch["x"].shape == (4, 3, 8, 8) and batch["x"].dtype == torch.uint8
    index = [int(k[4:]) for k in batch["key"]]
    assert batch["x"][:, 0, 0, 0].tolist() == index and (batch["label"] == -1).all()
    if a_kind == "vector":
        assert batch["a"].dtype == torch.float32
        torch.testing.assert_close(batch["a"], torch.tensor(a[index], dtype=torch.float32))
    else:
        assert batch["a"].shape == (4, 1, 6, 6) and batch["a"][:, 0, 0, 0].tolist() == index  # stays paired


# ---------------------------------------------------------------------------------------------- bad data


def test_corrupt_image_is_skipped_with_a_warning_then_an_error_past_the_limit(tmp_path, caplog):
    root = write_toy(tmp_path, n=24, shard_size=6, corrupt={7})
    shard_of_7 = next(str(root / name) for name, _ in read_index(root).shards("train") if name.endswith("1.tar"))
    stream = open_stream(root, batch_size=4, num_workers=0, max_corrupt=1, shuffle_block=0)
    with caplog.at_level(logging.WARNING, logger="eigtrain.data.stream"):
        batches = [b for _, b in zip(range(stream.batches_per_epoch), stream)]
    sizes = sorted(len(b["key"]) for b in batches)
    assert sizes == [3, 4, 4, 4, 4, 4] and stream.corrupt_count == 1  # the batch stays, one sample short
    assert "toy-00007" not in sum((b["key"] for b in batches), [])
    assert f"shard {shard_of_7}, key toy-00007" in caplog.text
    strict = open_stream(root, batch_size=4, num_workers=0, max_corrupt=0, shuffle_block=0)
    with pytest.raises(CorruptDataError, match=f"max_corrupt=0; the last: shard {shard_of_7}, key toy-00007"):
        list(zip(range(6), strict))


@pytest.mark.slow
@pytest.mark.parametrize("cut", [0, 700], ids=["at-a-member-boundary", "inside-a-member"])
def test_truncated_tar_counts_the_missing_samples_and_names_the_shard(tmp_path, cut):
    root = write_toy(tmp_path, n=48, shard_size=12)
    victim = root / "train-000002.tar"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2 + cut])
    stream = open_stream(root, batch_size=6, num_workers=2, max_corrupt=12)
    seen = collections.Counter(k for _, b in zip(range(stream.batches_per_epoch), stream) for k in b["key"])
    lost = 48 - len(seen)
    assert 0 < lost <= 12 and stream.corrupt_count == lost and max(seen.values()) == 1
    assert stream.batches_per_epoch == 8  # batch count and boundaries are unchanged: short batches, no shift
    strict = open_stream(root, batch_size=6, num_workers=2, max_corrupt=2)
    with pytest.raises(CorruptDataError, match="more than max_corrupt=2; the last: shard .*train-000002.tar, key "):
        list(zip(range(strict.batches_per_epoch), strict))


def test_sample_missing_a_field_is_unusable(tmp_path):
    samples = list(toy_samples(8))
    del samples[3]["cls"]
    write_shards(tmp_path, {"train": samples}, shard_size=8, meta=META)
    stream = open_stream(tmp_path, batch_size=8, num_workers=0, max_corrupt=0, shuffle_block=0)
    with pytest.raises(CorruptDataError, match="key toy-00003: KeyError: .no label member cls"):
        next(iter(stream))
