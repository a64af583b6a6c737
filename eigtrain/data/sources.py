"""Readers that turn a raw data set into encoded samples for the shard writer.

A source yields, per split, dicts ``{"__key__": str, <field>: bytes | int, ...}`` in the order they are to be
written, already shuffled by the seed, so that every shard is an i.i.d. subset of its split (the stream only
shuffles shard order and within blocks). Fields:

- views data: ``png`` or ``jpg`` (the encoded image) and ``cls`` (int label) when the source has labels;
- pairs data: ``x.png`` and either ``a.png`` (second image) or ``a.npy`` (float32 vector), ``cls`` optional.

Arrays are stored losslessly as PNG: digits as 1-channel 8x8 (pixel = round(value * 255 / 16)), CIFAR-10 as
3-channel 32x32. Image-folder files that already are JPEG or PNG are stored byte for byte (no re-encoding);
other formats are decoded with PIL and stored as PNG.
"""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from PIL import Image

CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
IMAGEFOLDER_SPLITS = ("train", "val", "test")


@dataclass
class Source:
    name: str
    splits: dict[str, Iterable[dict]]
    meta: dict = field(default_factory=dict)


def png_bytes(image: np.ndarray) -> bytes:
    """PNG-encode a uint8 image given as (H, W) or (C, H, W) with C in {1, 3}."""
    if image.ndim == 3:
        image = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buffer, format="PNG")
    return buffer.getvalue()


def npy_bytes(vector: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(vector, dtype=np.float32))
    return buffer.getvalue()


def split_indices(n: int, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Disjoint, shuffled train/val index sets (no val split when val_fraction is 0)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    splits = {"train": order[n_val:]}
    if n_val:
        splits["val"] = order[:n_val]
    return splits


# ---------------------------------------------------------------------------------------------- digits


def digits_source(val_fraction: float = 0.2, seed: int = 0) -> Source:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes), stored as 1-channel PNG."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # values are 0..16
    labels = digits.target.astype(np.int64)

    def samples(indices):
        for i in indices:
            yield {"__key__": f"digits-{i:04d}", "png": png_bytes(images[i]), "cls": int(labels[i])}

    splits = {name: samples(idx) for name, idx in split_indices(len(images), val_fraction, seed).items()}
    meta = dict(
        mode="views",
        channels=1,
        image_shape=[1, 8, 8],
        labels=True,
        num_classes=10,
        classes=[str(c) for c in range(10)],
    )
    return Source("digits", splits, meta)


# ---------------------------------------------------------------------------------------------- CIFAR-10


def _cifar_dir(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"cifar10 source: path {path} does not exist")
    if not (path / CIFAR_TRAIN[0]).exists() and (path / "cifar-10-batches-py").is_dir():
        path = path / "cifar-10-batches-py"  # the directory the official archive unpacks to
    return path


class _ArrayUnpickler(pickle.Unpickler):
    """The CIFAR-10 python batches are pickles of dicts, lists, bytes, ints and numpy arrays: build only those.
    Containers and scalars need no global; numpy arrays need exactly these (module, name) pairs (numpy 1's and 2's
    module names, the protocol-2 and protocol-5 forms); any other global, a dotted name included, is refused
    before it is looked up, so a planted ``data_batch_1`` runs nothing."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):  # how protocol 2 writes bytes: encode(text, "latin1")
            return _latin1_bytes
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a CIFAR-10 batch (refused: it could run code)")


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol 2's bytes, rebuilt by this one codec only (a codec name is looked up by importing its module)."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r} is not part of a CIFAR-10 batch (refused)")
    return text.encode("latin1")


def _read_pickle(file: Path) -> dict:
    if not file.is_file():
        raise FileNotFoundError(f"cifar10 source: missing file {file}")
    try:
        with open(file, "rb") as f:
            return _ArrayUnpickler(f, encoding="bytes").load()
    except Exception as exn:  # unpickling garbage raises many different types
        raise ValueError(f"cifar10 source: cannot unpickle {file}: {type(exn).__name__}: {exn}") from exn


def read_cifar_batch(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: (N, 3, 32, 32) uint8 images and (N,) int64 labels."""
    batch = _read_pickle(file)
    layout = "a dict with b'data' (N x 3072 uint8, channel-major) and b'labels' (N ints)"
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(f"cifar10 source: {file} is not a CIFAR-10 batch; expected {layout}, got {keys}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
        raise ValueError(
            f"cifar10 source: {file} has data {data.dtype}{list(data.shape)} and labels {list(labels.shape)}; "
            f"expected {layout}"
        )
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def cifar10_source(path: str | Path, seed: int = 0) -> Source:
    """The CIFAR-10 python pickles: data_batch_1..5 -> split "train", test_batch -> split "val"."""
    root = _cifar_dir(Path(path))
    files = {"train": [root / name for name in CIFAR_TRAIN], "val": [root / CIFAR_TEST]}
    arrays = {}
    for split, batch_files in files.items():  # read everything first: bad input fails before any writing
        parts = [read_cifar_batch(f) for f in batch_files]
        arrays[split] = [
            (f.name, i, image, label)
            for f, (images, labels) in zip(batch_files, parts)
            for i, (image, label) in enumerate(zip(images, labels))
        ]
    classes = [str(c) for c in range(10)]
    if (root / "batches.meta").is_file():
        names = _read_pickle(root / "batches.meta").get(b"label_names")
        if names and len(names) == 10:
            classes = [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    def samples(records, order):
        for j in order:
            batch, i, image, label = records[j]
            yield {"__key__": f"cifar10-{batch}-{i:05d}", "png": png_bytes(image), "cls": int(label)}

    rng = np.random.default_rng(seed)
    splits = {split: samples(recs, rng.permutation(len(recs))) for split, recs in arrays.items()}
    meta = dict(mode="views", channels=3, image_shape=[3, 32, 32], labels=True, num_classes=10, classes=classes)
    return Source("cifar10", splits, meta)


# ---------------------------------------------------------------------------------------------- image folder


def _sanitize_key(text: str) -> str:
    # webdataset splits a tar member name at the first dot of its base name: keys must not contain dots
    return re.sub(r"[^A-Za-z0-9_/-]", "_", text)


def _image_sample_bytes(file: Path) -> tuple[str, bytes]:
    """(field, bytes) for one image file; JPEG/PNG pass through, other formats become PNG. Fails naming the file."""
    from PIL import UnidentifiedImageError

    try:
        data = file.read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # a full decode: catches truncated files, not just bad headers
            kind = image.format
            if kind not in ("JPEG", "PNG"):
                data = png_bytes(np.asarray(image.convert("RGB")).transpose(2, 0, 1))
    except (OSError, UnidentifiedImageError, ValueError) as exn:
        raise ValueError(f"imagefolder source: cannot read image {file}: {exn}") from exn
    return ("jpg" if kind == "JPEG" else "png"), data


def imagefolder_source(path: str | Path, seed: int = 0) -> Source:
    """ImageNette-style folders ``path/{train,val[,test]}/<class>/<image>``; classes from ``train``."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"imagefolder source: path {root} is not a directory")
    if not (root / "train").is_dir():
        raise FileNotFoundError(f"imagefolder source: {root / 'train'} does not exist (expected train/<class>/...)")
    classes = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
    if not classes:
        raise ValueError(f"imagefolder source: {root / 'train'} has no class folders")
    class_index = {c: i for i, c in enumerate(classes)}
    rng = np.random.default_rng(seed)
    splits: dict[str, Iterable[dict]] = {}
    for split in IMAGEFOLDER_SPLITS:
        split_dir = root / split
        if not split_dir.is_dir():
            continue
        items = []
        for class_dir in sorted(d for d in split_dir.iterdir() if d.is_dir()):
            if class_dir.name not in class_index:
                raise ValueError(f"imagefolder source: class folder {class_dir} is not among the train classes")
            items += [
                (f, class_index[class_dir.name])
                for f in sorted(class_dir.iterdir())
                if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES
            ]
        if not items:
            raise ValueError(f"imagefolder source: no images under {split_dir}")
        splits[split] = _folder_samples(root, split, [items[j] for j in rng.permutation(len(items))])
    meta = dict(mode="views", channels=3, image_shape=None, labels=True, num_classes=len(classes), classes=classes)
    return Source("imagefolder", splits, meta)


def _folder_samples(root: Path, split: str, items: list[tuple[Path, int]]) -> Iterator[dict]:
    for file, label in items:
        kind, data = _image_sample_bytes(file)
        key = _sanitize_key(f"{split}/{file.parent.name}/{file.stem}")
        yield {"__key__": key, kind: data, "cls": label}


# ---------------------------------------------------------------------------------------------- npz arrays


def _as_chw_uint8(array: np.ndarray, name: str, file: Path) -> np.ndarray:
    """Images as (N, C, H, W) uint8 from (N, H, W), (N, H, W, C) or (N, C, H, W) with C in {1, 3}."""
    if array.dtype != np.uint8:
        raise ValueError(f"npz source: {file}: array {name!r} must be uint8 images, got {array.dtype}")
    if array.ndim == 3:
        return array[:, None]
    if array.ndim == 4 and array.shape[-1] in (1, 3):
        return array.transpose(0, 3, 1, 2)
    if array.ndim == 4 and array.shape[1] in (1, 3):
        return array
    raise ValueError(
        f"npz source: {file}: array {name!r} has shape {list(array.shape)}; expected (N,H,W), (N,H,W,C) or "
        f"(N,C,H,W) with C in {{1, 3}}"
    )


def npz_source(path: str | Path, val_fraction: float = 0.2, seed: int = 0) -> Source:
    """Arrays in a .npz: ``x`` (or ``images``) uint8 images, optional ``a`` (second image or float vector per
    sample: stored pairs for the two-encoder case) and optional ``y`` (or ``labels``) int labels."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"npz source: file {file} does not exist")
    try:
        with np.load(file, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except Exception as exn:
        raise ValueError(f"npz source: cannot read {file}: {type(exn).__name__}: {exn}") from exn
    x_name = next((k for k in ("x", "images") if k in arrays), None)
    if x_name is None:
        raise ValueError(f"npz source: {file} needs an image array 'x' (or 'images'); found {sorted(arrays)}")
    x = _as_chw_uint8(arrays[x_name], x_name, file)
    n = len(x)
    y_name = next((k for k in ("y", "labels") if k in arrays), None)
    labels = None if y_name is None else np.asarray(arrays[y_name])
    if labels is not None and (labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(
            f"npz source: {file}: {y_name!r} must be ({n},) integers, got {labels.dtype}{list(labels.shape)}"
        )
    a = arrays.get("a")
    if a is not None and len(a) != n:
        raise ValueError(f"npz source: {file}: 'a' has {len(a)} rows but {x_name!r} has {n}")
    a_is_vector = a is not None and a.ndim == 2
    if a is not None and not a_is_vector:
        a = _as_chw_uint8(a, "a", file)
    if a is not None and a_is_vector and not np.issubdtype(a.dtype, np.number):
        raise ValueError(f"npz source: {file}: vector array 'a' must be numeric, got {a.dtype}")

    image_field = "png" if a is None else "x.png"

    def samples(indices):
        for i in indices:
            sample = {"__key__": f"npz-{i:08d}", image_field: png_bytes(x[i])}
            if a is not None:
                sample["a.npy" if a_is_vector else "a.png"] = npy_bytes(a[i]) if a_is_vector else png_bytes(a[i])
            if labels is not None:
                sample["cls"] = int(labels[i])
            yield sample

    splits = {name: samples(idx) for name, idx in split_indices(n, val_fraction, seed).items()}
    meta = dict(
        mode="views" if a is None else "pairs",
        channels=int(x.shape[1]),
        image_shape=list(x.shape[1:]),
        labels=labels is not None,
        num_classes=None if labels is None else int(labels.max()) + 1,
    )
    if a is not None:
        meta["a_kind"] = "vector" if a_is_vector else "image"
        meta["a_shape"] = list(a.shape[1:])
    return Source("npz", splits, meta)
