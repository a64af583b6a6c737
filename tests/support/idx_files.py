"""Small MNIST-format idx files written by tests (the layout of Fashion-MNIST's, gzipped or not)."""

import gzip
from pathlib import Path

import numpy as np

REAL_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist


def idx_bytes(array: np.ndarray, dtype_code: int = 0x08) -> bytes:
    """An idx file's bytes: magic 00 00 <dtype code> <ndim>, big-endian uint32 dimensions, then the data."""
    header = bytes([0, 0, dtype_code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_idx(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def class_images(n: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, size, size) uint8 images whose class (0..9) sets a bright bar's row, with noise; (n,) labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    images = rng.integers(0, 60, (n, size, size)).astype(np.uint8)
    rows = (labels.astype(int) * size) // 10
    images[np.arange(n), rows] = 255
    return images, labels


def write_idx_dir(directory: Path, n_train: int = 60, n_test: int = 20, size: int = 28, gz: bool = True) -> dict:
    """The four standard files in `directory`; returns {prefix: (images, labels)} as written."""
    directory.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    arrays = {"train": class_images(n_train, size, 0), "t10k": class_images(n_test, size, 1)}
    for prefix, (images, labels) in arrays.items():
        write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", idx_bytes(images))
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", idx_bytes(labels))
    return arrays
