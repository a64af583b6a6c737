"""Shard writing: the sources, the index, the `eigtrain-shards` command and its errors."""

import io
import json
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from eigtrain.data import read_index, write_shards
from eigtrain.data.write import main


def read_tar(path):
    """{key: {field: bytes}} of one shard, read with the standard library, not with our reader."""
    samples = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, field = member.name.split(".", 1)
            samples.setdefault(key, {})[field] = tar.extractfile(member).read()
    return samples


def read_split(root, split):
    index = read_index(root)
    samples = {}
    for name, count in index.shards(split):
        shard = read_tar(root / name)
        assert len(shard) == count, name
        samples.update(shard)
    return samples


def png_pixels(data):
    """(C, H, W) pixels, decoded with PIL (independent of the stream's decoder)."""
    array = np.asarray(Image.open(io.BytesIO(data)))
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def test_digits_cli_writes_disjoint_splits_of_fixed_size_shards(tmp_path, capsys):
    from sklearn.datasets import load_digits

    out = tmp_path / "digits"
    main(["source=digits", f"out={out}", "shard_size=500", "val_fraction=0.2", "seed=0"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"] == {"train": {"shards": 3, "samples": 1438}, "val": {"shards": 1, "samples": 359}}
    index = read_index(out)
    assert [n for _, n in index.shards("train")] == [500, 500, 438]
    assert index.meta["image_shape"] == [1, 8, 8] and index.meta["num_classes"] == 10
    train, val = read_split(out, "train"), read_split(out, "val")
    assert not set(train) & set(val) and len(train) + len(val) == 1797
    digits = load_digits()
    for key in list(train)[:20]:
        i = int(key.split("-")[1])
        pixels = png_pixels(train[key]["png"])
        assert pixels.shape == (1, 8, 8)
        np.testing.assert_array_equal(pixels[0], np.rint(digits.images[i] * 255 / 16))
        assert int(train[key]["cls"]) == digits.target[i]


def test_existing_output_needs_overwrite(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((10, 4, 4), np.uint8))
    args = ["source=npz", f"path={tmp_path / 'a.npz'}", f"out={tmp_path / 'd'}", "val_fraction=0"]
    main(args + ["shard_size=3"])
    with pytest.raises(SystemExit, match="overwrite=true"):
        main(args)
    main(args + ["shard_size=20", "overwrite=true"])
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["index.json", "train-000000.tar"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["source=digits", "out=x", "shardsize=3"], "unknown key 'shardsize'"),
        (["source=mnist", "out=x"], "unknown source 'mnist'"),
        (["source=digits"], "missing out="),
        (["source=cifar10", "out=x"], "needs path="),
        (["source=cifar10", "out=x", "path=y", "val_fraction=0.1"], "val_fraction does not apply"),
        (["source=digits", "out=x", "seed=abc"], "bad value for seed"),
    ],
)
def test_cli_rejects_bad_arguments_naming_them(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(argv)


# ---------------------------------------------------------------------------------------------- CIFAR-10


def write_fake_cifar(root, per_batch=4):
    rng = np.random.default_rng(0)
    root.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    batches = {}
    for name in names:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        batches[name] = (data, labels)
        with open(root / name, "wb") as f:
            pickle.dump(
                {b"batch_label": name.encode(), b"data": data, b"labels": labels, b"filenames": [b"x.png"] * per_batch},
                f,
                protocol=2,
            )
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, f)
    return batches


def test_cifar10_pickles_become_train_and_val_shards(tmp_path):
    batches = write_fake_cifar(tmp_path / "cifar")
    out = tmp_path / "shards"
    main(["source=cifar10", f"path={tmp_path / 'cifar'}", f"out={out}", "shard_size=6"])
    index = read_index(out)
    assert index.num_samples("train") == 20 and index.num_samples("val") == 4
    assert index.meta["classes"][3] == "class3" and index.meta["image_shape"] == [3, 32, 32]
    train = read_split(out, "train")
    data, labels = batches["data_batch_3"]
    sample = train["cifar10-data_batch_3-00002"]
    np.testing.assert_array_equal(png_pixels(sample["png"]), data[2].reshape(3, 32, 32))  # channel-major rows
    assert int(sample["cls"]) == labels[2]
    assert set(read_split(out, "val")) == {f"cifar10-test_batch-{i:05d}" for i in range(4)}


def test_cifar10_errors_name_the_file(tmp_path):
    root = tmp_path / "cifar"
    with pytest.raises(SystemExit, match="does not exist"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    write_fake_cifar(root)
    (root / "data_batch_3").unlink()
    with pytest.raises(SystemExit, match="missing file .*data_batch_3"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    (root / "data_batch_3").write_bytes(b"this is not a pickle")
    with pytest.raises(SystemExit, match="cannot unpickle .*data_batch_3"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    with open(root / "data_batch_3", "wb") as f:
        pickle.dump({b"images": np.zeros((2, 3072), np.uint8)}, f)
    with pytest.raises(SystemExit, match="data_batch_3 is not a CIFAR-10 batch"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    with open(root / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(SystemExit, match=r"data_batch_3 has data uint8\[2, 1024\]"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    assert not (tmp_path / "o" / "index.json").exists()


# ---------------------------------------------------------------------------------------------- image folder


def write_image(path, size, fmt, seed):
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return pixels


def test_imagefolder_keeps_jpeg_bytes_and_labels_by_class_folder(tmp_path):
    root = tmp_path / "imagenette"
    files = {}
    for split, n in (("train", 3), ("val", 1)):
        for c, cls in enumerate(["n01", "n02"]):
            for i in range(n):
                fmt, ext = ("JPEG", "JPEG") if i % 2 == 0 else ("PNG", "png")
                path = root / split / cls / f"img.{i}.{ext}"  # a dot in the stem: keys must not keep it
                write_image(path, (20 + i, 30), fmt, seed=c * 10 + i)
                files[(split, cls, i)] = path
    (root / "train" / "n01" / "notes.txt").write_text("not an image")
    bmp = root / "train" / "n02" / "img_bmp.bmp"
    bmp_pixels = write_image(bmp, (5, 6), "BMP", seed=99)
    out = tmp_path / "shards"
    main(["source=imagefolder", f"path={root}", f"out={out}", "shard_size=2"])
    index = read_index(out)
    assert index.num_samples("train") == 7 and index.num_samples("val") == 2
    assert index.meta["classes"] == ["n01", "n02"] and index.meta["channels"] == 3
    train = read_split(out, "train")
    jpeg = train["train/n02/img_0"]
    assert jpeg["jpg"] == files[("train", "n02", 0)].read_bytes() and int(jpeg["cls"]) == 1
    assert train["train/n01/img_1"]["png"] == files[("train", "n01", 1)].read_bytes()
    np.testing.assert_array_equal(png_pixels(train["train/n02/img_bmp"]["png"]), bmp_pixels.transpose(2, 0, 1))
    assert not set(train) & set(read_split(out, "val"))


def test_imagefolder_broken_image_names_the_file(tmp_path):
    root = tmp_path / "folder"
    good = root / "train" / "a" / "good.jpg"
    write_image(good, (16, 16), "JPEG", 0)
    bad = root / "train" / "a" / "bad.jpg"
    bad.write_bytes(good.read_bytes()[:200])  # truncated JPEG
    with pytest.raises(SystemExit, match="cannot read image .*bad.jpg"):
        main(["source=imagefolder", f"path={root}", f"out={tmp_path / 'o'}"])
    with pytest.raises(SystemExit, match="train does not exist"):
        main(["source=imagefolder", f"path={tmp_path}", f"out={tmp_path / 'o'}"])


# ---------------------------------------------------------------------------------------------- npz pairs


@pytest.mark.parametrize("a_kind", ["vector", "image"])
def test_npz_pairs(tmp_path, a_kind):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (30, 6, 6, 3), dtype=np.uint8)
    a = rng.normal(size=(30, 5)) if a_kind == "vector" else rng.integers(0, 256, (30, 1, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / "pairs.npz", x=x, a=a, y=np.arange(30) % 3)
    out = tmp_path / "shards"
    main(["source=npz", f"path={tmp_path / 'pairs.npz'}", f"out={out}", "val_fraction=0.2", "shard_size=10"])
    index = read_index(out)
    assert index.meta["mode"] == "pairs" and index.meta["a_kind"] == a_kind
    assert index.num_samples("train") == 24 and index.num_samples("val") == 6
    sample = read_split(out, "train")["npz-00000007"]
    np.testing.assert_array_equal(png_pixels(sample["x.png"]), x[7].transpose(2, 0, 1))
    if a_kind == "vector":
        np.testing.assert_allclose(np.load(io.BytesIO(sample["a.npy"])), a[7], rtol=1e-6)
    else:
        np.testing.assert_array_equal(png_pixels(sample["a.png"]), a[7])
    assert int(sample["cls"]) == 7 % 3


def test_npz_errors_name_the_file(tmp_path):
    np.savez(tmp_path / "bad.npz", x=np.zeros((4, 5, 5), np.float32))
    with pytest.raises(SystemExit, match=r"bad.npz: array 'x' must be uint8"):
        main(["source=npz", f"path={tmp_path / 'bad.npz'}", f"out={tmp_path / 'o'}"])
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(SystemExit, match="cannot read .*junk.npz"):
        main(["source=npz", f"path={tmp_path / 'junk.npz'}", f"out={tmp_path / 'o'}"])
    with pytest.raises(SystemExit, match="missing.npz does not exist"):
        main(["source=npz", f"path={tmp_path / 'missing.npz'}", f"out={tmp_path / 'o'}"])


def test_write_shards_rejects_a_sample_in_two_splits(tmp_path):
    sample = {"__key__": "k1", "png": b"..."}
    with pytest.raises(ValueError, match="'k1' occurs twice"):
        write_shards(tmp_path, {"train": [sample], "val": [sample]})


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar10_batches_of_either_protocol_are_read(tmp_path, protocol):
    from eigtrain.data.sources import read_cifar_batch

    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    with open(tmp_path / "data_batch_1", "wb") as f:
        pickle.dump({b"data": data, b"labels": [3, 4], b"filenames": [b"a.png", b"b.png"]}, f, protocol=protocol)
    images, labels = read_cifar_batch(tmp_path / "data_batch_1")
    np.testing.assert_array_equal(images.reshape(2, -1), data) and labels.tolist() == [3, 4]


class _Planted:
    def __init__(self, marker, how):
        self.marker, self.how = marker, how

    def __reduce__(self):  # what a hostile batch file holds: a call made while it is unpickled
        import os

        return (os.system, (f"touch {self.marker}",)) if self.how == "system" else (open, (str(self.marker), "w"))


@pytest.mark.parametrize("how", ["system", "open"])
def test_a_planted_cifar_batch_runs_nothing_and_is_one_line(tmp_path, how):
    """issue 51 §4: eigtrain-shards source=cifar10 unpickled data_batch_1 with no restriction, so its command ran
    before the one-line error; the restricted unpickler builds dicts, lists, bytes, ints and numpy arrays only."""
    root, marker = tmp_path / "cifar", tmp_path / "code-ran"
    write_fake_cifar(root)
    with open(root / "data_batch_1", "wb") as f:
        pickle.dump({b"data": _Planted(marker, how), b"labels": [0]}, f)
    with pytest.raises(SystemExit, match=r"cannot unpickle .*data_batch_1: .*not part of a CIFAR-10 batch"):
        main(["source=cifar10", f"path={root}", f"out={tmp_path / 'o'}"])
    assert not marker.exists()
