"""eigtrain-shards source=idx: MNIST-format files (gzipped or not) become splits train/val with labels; malformed
files are refused in one line naming the file; Debian's Fashion-MNIST files give 60,000 + 10,000 samples."""

import gzip
import os
import re
import tracemalloc

import numpy as np
import pytest

from eigtrain.data import read_index
from eigtrain.data.idx_files import read_idx, read_split
from eigtrain.data.write import main
from tests.data.test_data_write import png_pixels
from tests.data.test_data_write import read_split as read_shards
from tests.support.idx_files import REAL_FASHION_MNIST, idx_bytes, write_idx, write_idx_dir


def shards(tmp_path, path, *extra):
    main(["source=idx", f"path={path}", f"out={tmp_path / 'out'}", "shard_size=25", *extra])
    return tmp_path / "out"


@pytest.mark.parametrize("gz", [True, False])
def test_idx_files_become_train_and_val_with_labels(tmp_path, gz):
    arrays = write_idx_dir(tmp_path / "idx", n_train=60, n_test=20, gz=gz)
    out = shards(tmp_path, tmp_path / "idx")
    index = read_index(out)
    assert index.num_samples("train") == 60 and index.num_samples("val") == 20
    meta = index.meta
    assert meta["source"] == "idx" and meta["channels"] == 1 and meta["image_shape"] == [1, 28, 28]
    assert meta["labels"] and meta["num_classes"] == 10
    train_images = arrays["train"][0] / 255
    assert meta["pixel_mean"] == [round(train_images.mean(), 4)] and meta["pixel_std"] == [round(train_images.std(), 4)]
    for split, prefix in (("train", "train"), ("val", "t10k")):  # the official test set is split val, whole
        images, labels = arrays[prefix]
        samples = read_shards(out, split)
        assert set(samples) == {f"idx-{prefix}-{i:06d}" for i in range(len(labels))}
        for key, sample in samples.items():
            i = int(key.rsplit("-", 1)[1])
            np.testing.assert_array_equal(png_pixels(sample["png"]), images[i][None])
            assert int(sample["cls"]) == labels[i]
    first = list(read_shards(out, "train"))[:25]
    assert first != sorted(first)  # shuffled by the seed, as the other sources are


def test_limit_writes_the_first_samples_of_each_shuffled_split(tmp_path):
    write_idx_dir(tmp_path / "idx", n_train=60, n_test=20)
    whole = read_shards(shards(tmp_path / "a", tmp_path / "idx"), "train")
    out = shards(tmp_path / "b", tmp_path / "idx", "limit=30")
    index = read_index(out)
    assert index.num_samples("train") == 30 and index.num_samples("val") == 20 and index.meta["limit"] == 30
    assert list(read_shards(out, "train")) == list(whole)[:30]
    with pytest.raises(SystemExit, match="limit must be >= 1"):
        shards(tmp_path / "c", tmp_path / "idx", "limit=0")


def malformed(root):
    """(what to break, the message expected); each case starts from a good directory."""
    good_labels = idx_bytes(np.zeros(60, np.uint8))
    images = root / "train-images-idx3-ubyte.gz"
    labels = root / "train-labels-idx1-ubyte.gz"
    good_images = idx_bytes(np.zeros((60, 28, 28), np.uint8))
    return {
        "magic": (labels, b"\x01\x02" + good_labels[2:], r"train-labels-idx1-ubyte.gz is not an idx file"),
        "dtype": (labels, good_labels[:2] + b"\x0d" + good_labels[3:], r"has dtype code 0x0d; expected 0x08"),
        "ndim": (
            images,
            idx_bytes(np.zeros((60, 784), np.uint8)),
            r"images-idx3-ubyte.gz has 2 dimensions; expected 3",
        ),
        "truncated": (images, good_images[:-100], r"images-idx3-ubyte.gz is truncated: .* 46940 of 47040 bytes"),
        "header": (images, good_images[:10], r"images-idx3-ubyte.gz is truncated: the shape has 6 of 12 bytes"),
        "trailing": (labels, good_labels + b"\0", r"labels-idx1-ubyte.gz holds more than the 60 bytes"),
        "counts": (labels, idx_bytes(np.zeros(59, np.uint8)), r"holds 60 images but .*labels-idx1-ubyte.gz holds 59"),
        "gzip": (images, None, r"cannot read .*images-idx3-ubyte.gz: BadGzipFile"),
        "sizes": (
            root / "t10k-images-idx3-ubyte.gz",
            idx_bytes(np.zeros((20, 27, 27), np.uint8)),
            r"train images are \[28, 28\] but t10k images \[27, 27\]",
        ),
    }


@pytest.mark.parametrize(
    "case", ["magic", "dtype", "ndim", "truncated", "header", "trailing", "counts", "gzip", "sizes"]
)
def test_malformed_idx_files_are_refused_in_one_line_naming_the_file(tmp_path, case, capsys):
    write_idx_dir(tmp_path / "idx", n_train=60, n_test=20)
    file, data, message = malformed(tmp_path / "idx")[case]
    if data is None:
        file.write_bytes(b"\x1f\x8b" + b"not deflate data" * 4)
    else:
        write_idx(file, data)
    with pytest.raises(SystemExit) as stop:
        shards(tmp_path, tmp_path / "idx")
    text = str(stop.value)
    assert len(text.splitlines()) == 1 and text.startswith("eigtrain-shards: error: idx source: ")
    assert re.search(message, text), text
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_missing_file_is_named(tmp_path):
    write_idx_dir(tmp_path / "idx", n_train=60, n_test=20)
    (tmp_path / "idx" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(SystemExit, match=r"idx source: missing file .*t10k-labels-idx1-ubyte\[\.gz\]$"):
        shards(tmp_path, tmp_path / "idx")
    with pytest.raises(SystemExit, match=r"idx source: path .*nowhere is not a directory"):
        shards(tmp_path, tmp_path / "nowhere")


def test_a_gzip_bomb_is_not_inflated_beyond_what_its_header_promises(tmp_path):
    """A 2-image header followed by 256 MiB of zeros (256 KiB gzipped): refused after reading one byte too many."""
    bomb = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        f.write(idx_bytes(np.zeros((2, 28, 28), np.uint8)))
        zeros = bytes(1 << 24)
        for _ in range(16):
            f.write(zeros)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="holds more than the 1568 bytes"):
            read_idx(bomb, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


# -- Debian's dataset-fashion-mnist: skipped without it, except in CI (which installs it: tools/run_tests.sh) -----


@pytest.fixture(scope="module")
def real_files():
    if not (REAL_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the real idx files: {REAL_FASHION_MNIST} is missing (dataset-fashion-mnist)")
        pytest.skip(f"{REAL_FASHION_MNIST} is missing (apt-get install dataset-fashion-mnist)")
    return REAL_FASHION_MNIST


def test_debians_fashion_mnist_has_60000_train_and_10000_test_labelled_images(real_files):
    for prefix, n in (("train", 60_000), ("t10k", 10_000)):
        images, labels = read_split(real_files, prefix)
        assert images.shape == (n, 28, 28) and sorted(np.bincount(labels)) == [n // 10] * 10


def test_training_runs_a_few_steps_on_the_real_files(real_files, tmp_path):
    from eigtrain.train.command import compose_config, run

    out = shards(tmp_path, real_files, "limit=256", "shard_size=128")
    assert read_index(out).num_samples("val") == 256
    run_dir = tmp_path / "run"
    overrides = ["experiment=cpu_debug", "data=fashion_mnist", f"data.root={out}", "steps=2", f"run_dir={run_dir}"]
    assert run(compose_config([*overrides, "logging.wandb.mode=disabled", "logging.progress=false"]))["step"] == 2
    assert (run_dir / "model.safetensors").exists()
