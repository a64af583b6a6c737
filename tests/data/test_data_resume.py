"""The data cursor: iterate k batches, save, rebuild, load: the next batches equal the uninterrupted run's."""

import io
import logging

import numpy as np
import pytest
import torch

from eigtrain.data import write_shards
from eigtrain.data.sources import png_bytes
from tests.support.streams import open_stream

pytestmark = [
    pytest.mark.slow,  # DataLoader worker processes
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """110 samples in 10 shards of 11: uneven per-worker remainders, 2 x 2 slots."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    samples = [
        {"__key__": f"s{i:04d}", "png": png_bytes(rng.integers(0, 256, (3, 6, 6), dtype=np.uint8)), "cls": i % 7}
        for i in range(110)
    ]
    write_shards(
        root, {"train": samples}, shard_size=11, meta=dict(mode="views", channels=3, image_shape=[3, 6, 6], labels=True)
    )
    return root


def take(stream, n):
    return [b for _, b in zip(range(n), stream)]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["key"] == w["key"]
        assert torch.equal(g["image"], w["image"]) and torch.equal(g["label"], w["label"])


def resumed(root, k, n, **kw):
    """Run k batches, save the cursor (through torch.save as a checkpoint would), rebuild, load, take n."""
    first = open_stream(root, **kw)
    take(first, k)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    second = open_stream(root, **kw)
    second.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    return take(second, n)


@pytest.mark.parametrize("resampled", [False, True])
def test_cursor_round_trip_inside_and_across_epochs(root, resampled):
    kw = dict(batch_size=4, num_workers=2, seed=5, shuffle_block=7, resampled=resampled)
    reference = open_stream(root, **kw)
    per_epoch = reference.batches_per_epoch  # 2 workers x 13 batches
    want = take(reference, 2 * per_epoch + 3)
    for k in (1, 5, per_epoch - 1, per_epoch + 2):  # odd k: the next batch comes from worker 1
        assert_same_batches(resumed(root, k, 4, **kw), want[k : k + 4])


def test_cursor_round_trip_on_two_ranks(root):
    for rank in (0, 1):
        kw = dict(batch_size=4, rank=rank, world_size=2, num_workers=2, seed=2)
        reference = open_stream(root, **kw)
        want = take(reference, reference.batches_per_epoch + 3)
        k = reference.batches_per_epoch - 2
        assert_same_batches(resumed(root, k, 5, **kw), want[k:])


def test_cursor_counts_the_batches_taken_not_those_decoded_ahead(root):
    """Batched (device-side) JPEG decoding finishes batches ahead on a thread; the cursor is the batches taken."""
    kw = dict(batch_size=4, num_workers=0, seed=3, shuffle_block=5, jpeg_device="cpu")
    want = take(open_stream(root, **kw), 34)
    for k in (1, 7, 28):  # 28: across the epoch's end
        assert_same_batches(resumed(root, k, 5, **kw), want[k : k + 5])


def test_one_pass_cursor_round_trip(root):
    kw = dict(batch_size=4, rank=1, world_size=2, num_workers=2, one_pass=True)
    want = list(open_stream(root, **kw))
    assert_same_batches(resumed(root, 5, 100, **kw), want[5:])


def test_layout_change_resumes_the_epoch_inexactly_with_a_warning(root, caplog):
    old = open_stream(root, batch_size=4, num_workers=2, seed=1)
    take(old, old.batches_per_epoch + 6)  # epoch 1, 6 batches x 4 samples in
    new = open_stream(root, batch_size=4, num_workers=1, seed=1)
    with caplog.at_level(logging.WARNING, logger="eigtrain.data.stream"):
        new.load_state_dict(old.state_dict())
    assert "not exact" in caplog.text
    assert new.epoch == 1 and new.state_dict()["restart"] == 1
    rest = take(new, new.batches_per_epoch - 6)
    keys = [k for b in rest for k in b["key"]]
    assert len(keys) == len(set(keys)) == 4 * (new.batches_per_epoch - 6) and new.epoch == 2


def test_state_from_another_stream_is_rejected(root):
    state = open_stream(root, batch_size=4, num_workers=0, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed is 1 in the state and 2 here"):
        open_stream(root, batch_size=4, num_workers=0, seed=2).load_state_dict(state)
