"""MNIST-format idx files (MNIST, Fashion-MNIST, KMNIST) as an ``eigtrain-shards`` source.

    eigtrain-shards source=idx path=/usr/share/datasets/fashion-mnist out=data/fashion_mnist

A directory holds the four standard files, each plain or gzipped (told apart by content, not by name):
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` (split train) and ``t10k-images-idx3-ubyte``,
``t10k-labels-idx1-ubyte`` (split val: the official test set, never mixed into train). An idx file is a big-endian
header (two zero bytes, a dtype code, the number of dimensions, then one uint32 per dimension) followed by the
array; images must be unsigned bytes of (N, H, W), labels unsigned bytes of (N,). Reads are bounded by what the
header promises, so a gzip that inflates to more than that is refused before it is inflated further.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from eigtrain.data.sources import Source, png_bytes

SPLIT_FILES = {"train": "train", "val": "t10k"}  # eigtrain's split -> the files' prefix
UBYTE = 0x08  # the idx dtype code of unsigned bytes (the only one MNIST-format image and label files use)
GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 1 << 24  # read in pieces: a header that promises terabytes allocates nothing up front


def _find(root: Path, prefix: str, kind: str, ndim: int) -> Path:
    """The file of one array: ``{prefix}-{kind}-idx{ndim}-ubyte`` (or ``.idx{ndim}-ubyte``), plain or ``.gz``."""
    stems = (f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte")
    for name in (s + ext for s in stems for ext in ("", ".gz")):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"idx source: missing file {root / (stems[0] + '[.gz]')}")


def _read_exactly(stream: BinaryIO, size: int, file: Path, what: str) -> bytes:
    parts, left = [], size
    while left:
        part = stream.read(min(left, CHUNK_BYTES))
        if not part:
            raise ValueError(f"idx source: {file} is truncated: {what} has {size - left} of {size} bytes")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_idx(file: Path, ndim: int) -> np.ndarray:
    """The uint8 array of one idx file with `ndim` dimensions; a ValueError naming the file and what is wrong."""
    try:
        with open(file, "rb") as raw:
            packed = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            stream: BinaryIO = gzip.GzipFile(fileobj=raw) if packed else raw  # type: ignore[assignment]
            return _parse(stream, file, ndim)
    except (OSError, EOFError, zlib.error) as exn:  # a damaged gzip stream
        if isinstance(exn, FileNotFoundError):
            raise
        raise ValueError(f"idx source: cannot read {file}: {type(exn).__name__}: {exn}") from None


def _parse(stream: BinaryIO, file: Path, ndim: int) -> np.ndarray:
    header = _read_exactly(stream, 4, file, "the header")
    if header[:2] != b"\0\0":
        raise ValueError(f"idx source: {file} is not an idx file (magic {header.hex()}, expected 0000XXYY)")
    if header[2] != UBYTE:
        raise ValueError(f"idx source: {file} has dtype code 0x{header[2]:02x}; expected 0x08 (unsigned bytes)")
    if header[3] != ndim:
        raise ValueError(f"idx source: {file} has {header[3]} dimensions; expected {ndim}")
    shape = tuple(int(d) for d in np.frombuffer(_read_exactly(stream, 4 * ndim, file, "the shape"), dtype=">u4"))
    size = int(np.prod(shape, dtype=np.int64))
    data = _read_exactly(stream, size, file, f"the data of shape {list(shape)}")
    if stream.read(1):
        raise ValueError(f"idx source: {file} holds more than the {size} bytes of data its shape {list(shape)} says")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def read_split(root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, H, W) uint8 images and (N,) int64 labels of one prefix (``train`` or ``t10k``)."""
    images_file, labels_file = _find(root, prefix, "images", 3), _find(root, prefix, "labels", 1)
    images, labels = read_idx(images_file, 3), read_idx(labels_file, 1)
    if len(images) != len(labels):
        raise ValueError(
            f"idx source: {images_file} holds {len(images)} images but {labels_file} holds {len(labels)} labels"
        )
    return images, labels.astype(np.int64)


def idx_source(path: str | Path, seed: int = 0) -> Source:
    """The idx files in directory `path`: train-* -> split "train", t10k-* -> split "val", each shuffled by `seed`."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"idx source: path {root} is not a directory")
    arrays = {split: read_split(root, prefix) for split, prefix in SPLIT_FILES.items()}  # all read: fail before writing
    shapes = {split: list(images.shape[1:]) for split, (images, _) in arrays.items()}
    if shapes["train"] != shapes["val"]:
        raise ValueError(f"idx source: {root}: train images are {shapes['train']} but t10k images {shapes['val']}")
    train_images = arrays["train"][0]
    num_classes = int(max(labels.max(initial=0) for _, labels in arrays.values())) + 1
    rng = np.random.default_rng(seed)

    def samples(split: str, order: np.ndarray) -> Iterator[dict]:
        images, labels = arrays[split]
        for i in order:
            key = f"idx-{SPLIT_FILES[split]}-{i:06d}"
            yield {"__key__": key, "png": png_bytes(images[i]), "cls": int(labels[i])}

    splits: dict[str, Iterable[dict]] = {
        split: samples(split, rng.permutation(len(labels))) for split, (_, labels) in arrays.items()
    }
    meta = dict(
        mode="views",
        channels=1,
        image_shape=[1, *shapes["train"]],
        labels=True,
        num_classes=num_classes,
        classes=[str(c) for c in range(num_classes)],
        pixel_mean=[round(float(train_images.mean()) / 255, 4)],  # of split train, scaled to 0..1
        pixel_std=[round(float(train_images.std()) / 255, 4)],
    )
    return Source("idx", splits, meta)
