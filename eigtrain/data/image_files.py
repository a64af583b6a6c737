"""Images that are not shards: a folder of image files (flat or not; no class folders needed) or a file list.

- a folder: every image file under it (by suffix, hidden entries skipped); each key is its path relative to the
  folder, with ``/``;
- a file list (a text file): one image path per line, relative to the list's folder or absolute; blank lines and
  lines starting with ``#`` are skipped; the key is the line as written. A line naming something that is not an
  image file (missing, a directory, another suffix) is refused in one line naming it.

`ImageFiles` reads them once, in key order, in batches shaped like a one-pass ShardStream's (``image``, ``key``, and
``size`` with fit ``whole``), each image decoded and brought to the size as the shard streams do
(`eigtrain.data.decode`); rank r of w reads every w-th file. An image that cannot be decoded is one line naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from eigtrain.data.decode import decode_image_sized

IMAGE_SUFFIXES = frozenset((".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"))


class ImageFilesError(ValueError):
    """An image source that cannot be used: one line naming the file or line."""


def list_images(source: str | os.PathLike) -> list[tuple[str, Path]]:
    """(key, path) of every image of a folder or a file list, sorted by key; ImageFilesError when there is none."""
    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(
            (p.relative_to(path).as_posix(), p)
            for p in path.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES
            and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
    elif path.is_file():
        files = sorted(_listed(path))
    else:
        raise ImageFilesError(f"images={source}: no such folder or file list")
    if not files:
        raise ImageFilesError(f"images={source}: no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files


def _listed(listing: Path) -> list[tuple[str, Path]]:
    try:
        lines = listing.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ImageFilesError(f"images={listing}: cannot read it as a text file list ({error})") from None
    files, seen = [], set()
    for number, line in enumerate(lines, 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        file = Path(key).expanduser()
        file = file if file.is_absolute() else listing.parent / file
        if file.suffix.lower() not in IMAGE_SUFFIXES or not file.is_file():
            raise ImageFilesError(f"images={listing} line {number}: {key} is not an image file ({file})")
        if key in seen:
            raise ImageFilesError(f"images={listing} line {number}: {key} is listed twice")
        seen.add(key)
        files.append((key, file))
    return files


class ImageFiles:
    """A one-pass stream of image files (`list_images`): batches of uint8 (B, C, H, W) at `size` by `fit`."""

    def __init__(
        self,
        files: list[tuple[str, Path]],
        channels: int,
        size: tuple[int, int],
        fit: str = "cover",
        batch_size: int = 256,
        rank: int = 0,
        world_size: int = 1,
        max_pixels: int | None = None,
    ):
        self.files, self.num_samples = files[rank::world_size], len(files)  # num_samples: every rank's
        self.channels, self.size, self.fit, self.max_pixels = channels, (int(size[0]), int(size[1])), fit, max_pixels
        self.batch_size = max(1, batch_size)

    def __iter__(self):
        for start in range(0, len(self.files), self.batch_size):
            part = self.files[start : start + self.batch_size]
            decoded = [self.decode(path) for _, path in part]
            batch: dict = {"image": torch.stack([d[0] for d in decoded]), "key": [key for key, _ in part]}
            if self.fit == "whole":
                batch["size"] = torch.tensor([d[1] for d in decoded], dtype=torch.int64).view(-1, 2)
            yield batch

    def decode(self, path: Path) -> tuple[torch.Tensor, tuple[int, int]]:
        try:
            return decode_image_sized(path.read_bytes(), self.channels, self.size, self.fit, self.max_pixels)
        except Exception as error:  # noqa: BLE001  (truncated, not an image, over the pixel budget, unreadable)
            first = next((s.strip() for s in str(error).splitlines() if s.strip()), type(error).__name__)
            raise ImageFilesError(f"{path}: cannot be used as an image ({first})") from None
