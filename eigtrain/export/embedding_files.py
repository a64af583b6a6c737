"""Embedding pairs on disk, streamed chunk by chunk (files may be larger than memory).

`embeddings=` accepts:
- `FILE.npz` with arrays z1, z2 (N x d each; loaded whole, as before),
- `FILE.safetensors` with tensors z1, z2 (memory-mapped),
- a directory of chunks, taken in name order: `NAME.safetensors` (tensors z1, z2), `NAME.npz` (arrays z1, z2),
  or pairs `NAMEz1.npy` + `NAMEz2.npy` (e.g. `part-000.z1.npy` + `part-000.z2.npy`, or just `z1.npy` + `z2.npy`),
  opened memory-mapped.

Every chunk's shapes are checked from the headers before anything is read; rows are split contiguously across
ranks (rank r reads global rows [N r / W, N (r + 1) / W)) and read `block` rows at a time.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from safetensors import SafetensorError

PAIR_KEYS = ("z1", "z2")
NATIVE = (np.float16, np.float32, np.float64)  # read as stored: Rayleigh-Ritz converts them to float64 exactly
NATIVE_TORCH = (torch.float16, torch.float32, torch.float64)


class EmbeddingFileError(ValueError):
    """Embedding files that cannot be reduced: names the file and what is wrong."""


class _SafetensorsRows:
    """Row slices of one tensor of a safetensors file, read lazily (memory-mapped), as numpy in a float dtype that
    converts exactly to float64 (bf16 as float32)."""

    def __init__(self, handle, key: str):
        self._slice = handle.get_slice(key)
        self.shape = tuple(self._slice.get_shape())

    def __getitem__(self, rows: slice) -> np.ndarray:
        rows_ = self._slice[rows]
        return (rows_ if rows_.dtype in NATIVE_TORCH else rows_.to(torch.float32)).numpy()


@dataclass
class PairChunk:
    name: str  # a file name, for messages
    z1: Any  # array-like: .shape and row slicing (numpy array, memmap, safetensors slice)
    z2: Any

    @property
    def rows(self) -> int:
        return self.z1.shape[0]


def _open_safetensors(path: Path) -> PairChunk:
    from safetensors import safe_open

    handle = _numeric(path, lambda: safe_open(str(path), framework="pt"))
    missing = [k for k in PAIR_KEYS if k not in handle.keys()]
    if missing:
        raise EmbeddingFileError(f"{path} lacks tensor(s) {missing}; expected z1, z2 of shape N x d")
    return PairChunk(path.name, *(_SafetensorsRows(handle, k) for k in PAIR_KEYS))


def _numeric(path: Path, load):
    """`load()` of a numpy file, or one line naming it: object arrays are pickles and never loaded."""
    try:
        return load()
    except EmbeddingFileError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, SafetensorError) as error:  # truncated, not that format
        raise EmbeddingFileError(f"cannot read {path}: {error}") from None


def _open_npz(path: Path) -> PairChunk:
    return _numeric(path, lambda: _read_npz(path))


def _read_npz(path: Path) -> PairChunk:
    with np.load(path, allow_pickle=False) as data:
        missing = [k for k in PAIR_KEYS if k not in data]
        if missing:
            raise EmbeddingFileError(f"{path} lacks array(s) {missing}; expected z1, z2 of shape N x d")
        return PairChunk(path.name, data["z1"], data["z2"])


def _open_npy_pair(first: Path) -> PairChunk:
    second = first.with_name(first.name[: -len("z1.npy")] + "z2.npy")
    if not second.exists():
        raise EmbeddingFileError(f"{first} has no partner {second.name} (chunks of .npy come in z1/z2 pairs)")
    # copy-on-write: the blocks are writable numpy views (torch takes them as they are) and the files never change
    first_rows, second_rows = (
        _numeric(p, lambda p=p: np.load(p, mmap_mode="c", allow_pickle=False)) for p in (first, second)
    )
    return PairChunk(first.name, first_rows, second_rows)


def open_chunks(path: str) -> list[PairChunk]:
    """The chunks of an embeddings file or directory, shapes checked (one EmbeddingFileError otherwise)."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"embeddings {path} does not exist")
    if root.is_dir():
        # hidden files are not chunks: macOS's AppleDouble companions (._part-000.npz), editors' and eigtrain's temporaries
        files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
        orphans = [
            p.name
            for p in files
            if p.name.endswith("z2.npy") and not p.with_name(p.name[: -len("z2.npy")] + "z1.npy").exists()
        ]
        if orphans:
            raise EmbeddingFileError(f"{root}: {orphans[0]} has no z1 partner (chunks of .npy come in z1/z2 pairs)")
        chunks = [
            _open_safetensors(p)
            if p.suffix == ".safetensors"
            else _open_npz(p)
            if p.suffix == ".npz"
            else _open_npy_pair(p)
            for p in files
            if p.suffix in (".safetensors", ".npz") or p.name.endswith("z1.npy")
        ]
        if not chunks:
            raise EmbeddingFileError(f"{root} holds no embedding chunks (*.safetensors, *.npz, or *z1.npy + *z2.npy)")
    elif root.suffix == ".safetensors":
        chunks = [_open_safetensors(root)]
    elif root.suffix == ".npz":
        chunks = [_open_npz(root)]
    else:
        raise EmbeddingFileError(f"embeddings={path}: expected an .npz or .safetensors file or a directory of chunks")
    _check_shapes(chunks, root)
    return chunks


def _check_shapes(chunks: list[PairChunk], root: Path) -> None:
    widths = None
    for chunk in chunks:
        for key in PAIR_KEYS:  # numbers only: complex, text, dates, booleans would be converted, or fail, silently
            dtype = getattr(getattr(chunk, key), "dtype", None)
            if dtype is not None and np.dtype(dtype).kind not in "fiu":
                raise EmbeddingFileError(f"{root / chunk.name}: {key} holds {np.dtype(dtype)} values, not real numbers")
        s1, s2 = tuple(chunk.z1.shape), tuple(chunk.z2.shape)
        if len(s1) != 2 or len(s2) != 2:
            raise EmbeddingFileError(f"{root / chunk.name}: z1 {s1} and z2 {s2} must both be N x d")
        if s1[0] != s2[0]:
            raise EmbeddingFileError(
                f"{root / chunk.name}: z1 has {s1[0]} rows but z2 has {s2[0]}; "
                f"rows are positive pairs and must match one to one"
            )
        if widths is None:
            widths = (s1[1], s2[1], chunk.name)
        elif (s1[1], s2[1]) != widths[:2]:
            raise EmbeddingFileError(
                f"{root / chunk.name}: widths z1 {s1[1]}, z2 {s2[1]} differ from "
                f"{widths[2]}'s z1 {widths[0]}, z2 {widths[1]}; every chunk must have the same widths"
            )


def widths(chunks: list[PairChunk]) -> tuple[int, int]:
    return chunks[0].z1.shape[1], chunks[0].z2.shape[1]


def total_rows(chunks: list[PairChunk]) -> int:
    return sum(c.rows for c in chunks)


def iter_blocks(
    chunks: list[PairChunk], rank: int = 0, world: int = 1, block: int = 65536
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This rank's contiguous share of all rows, `block` rows at a time (never across a chunk boundary), as arrays
    of a float dtype that converts exactly to float64 (float16, float32, float64: as stored, a memory-mapped file's
    rows not even copied; anything else as float64). A row with NaN or inf is one EmbeddingFileError naming the
    chunk and the row."""
    n = total_rows(chunks)
    lo, hi = n * rank // world, n * (rank + 1) // world
    offset = 0
    for chunk in chunks:
        start, stop = max(lo - offset, 0), min(hi - offset, chunk.rows)
        for s in range(start, stop, block):
            e = min(s + block, stop)
            z1, z2 = (_native(z[s:e]) for z in (chunk.z1, chunk.z2))
            for key, z in (("z1", z1), ("z2", z2)):
                if np.isfinite(z.sum(axis=0)).all():  # a NaN or inf makes its column's sum non-finite
                    continue
                finite = np.isfinite(z).all(axis=1)
                if not finite.all():  # (else finite values whose sum overflowed: the moments will say so)
                    row = s + int(np.argmin(finite))
                    raise EmbeddingFileError(
                        f"{chunk.name}: row {row} of {key} holds NaN or inf; "
                        f"remove or fix that pair before Rayleigh-Ritz"
                    )
            yield z1, z2
        offset += chunk.rows


def _native(rows) -> np.ndarray:
    """A block's rows as an array: as stored for a float dtype that converts exactly to float64, else float64."""
    rows = np.asarray(rows)
    return rows if rows.dtype in NATIVE else rows.astype(np.float64)
