"""The standalone file's contract beyond its graph, read from its metadata (eigtrain.json): how a raw image becomes
the file's input (`reference_transform`, the `preprocess` spec) and how two feature vectors compare (`similarity`,
the `similarity` spec). Plain torch, torchvision and PIL: this module imports nothing of eigtrain, so it can be
copied beside a served model. tests/export/test_standalone_preprocess.py holds it equal to eigtrain-embed (1e-4).

    transform = reference_transform(meta)               # path | bytes | PIL image | uint8 (C, H, W) tensor
    features = model(torch.stack([transform(p) for p in paths]))
    scores = similarity(features[:1], features, meta, k=16)   # the metric the metadata states (cosine by default)
"""

from __future__ import annotations

import io
import math
import os
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

SIMILARITIES = ("cosine", "spectral")


def reference_transform(meta: dict) -> Callable[[Any], torch.Tensor]:
    """image -> the file's input for it: float32 (C, H, W) in [0, 1] (the file normalizes by mean/std itself)."""
    spec = meta.get("preprocess")
    if not isinstance(spec, dict):
        raise ValueError(
            "this file's metadata holds no 'preprocess' spec (written before it was recorded): export again"
        )
    resize, view = spec["resize"], spec["view_resize"]
    if resize is not None and resize["fit"] != "cover":
        raise ValueError(f"resize fit={resize['fit']!r}: the reference implements fit='cover' only")
    size = tuple(resize["size"]) if resize else None
    mode = spec["channel_order"]  # "L" or "RGB"

    def transform(image: Any) -> torch.Tensor:
        pixels = decode(image, mode, size)
        if size is not None:
            pixels = cover(pixels, size)
        x = pixels.float().div(255)
        if view is not None and tuple(x.shape[-2:]) != tuple(view["size"]):  # bilinear, antialiased, aspect not kept
            x = F.interpolate(x[None], size=list(view["size"]), mode="bilinear", antialias=True, align_corners=False)
            x = x[0].clamp(0, 1)
        return x

    return transform


def decode(image: Any, mode: str, size: tuple[int, int] | None = None) -> torch.Tensor:
    """uint8 (C, H, W) in `mode` (L | RGB). Encoded bytes (or a file path) are read as eigtrain's data workers read
    them: torchvision.io.decode_image (16-bit images keep their top 8 bits), except a JPEG at least twice the
    resize `size` each way, which libjpeg decodes at 1/2, 1/4 or 1/8 scale first (PIL's draft)."""
    if isinstance(image, torch.Tensor):
        return image
    if isinstance(image, Image.Image):
        return _array(image.convert(mode))
    data = open(image, "rb").read() if isinstance(image, (str, os.PathLike)) else bytes(image)
    if size is not None and data[:2] == b"\xff\xd8" and (drafted := _jpeg_draft(data, mode, size)) is not None:
        return drafted
    pixels = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode[_READ[mode]])
    return pixels if pixels.dtype == torch.uint8 else (pixels.to(torch.int32) >> 8).to(torch.uint8)


_READ = {"L": "GRAY", "RGB": "RGB"}


def _array(pil: Image.Image) -> torch.Tensor:
    array = np.asarray(pil)
    return torch.from_numpy(array.reshape(*array.shape[:2], -1).transpose(2, 0, 1).copy())


def _jpeg_draft(data: bytes, mode: str, size: tuple[int, int]) -> torch.Tensor | None:
    with Image.open(io.BytesIO(data)) as pil:
        width, height = pil.size
        scale = max(size[0] / height, size[1] / width)
        if scale > 0.5:
            return None
        pil.draft(mode, (math.ceil(width * scale), math.ceil(height * scale)))
        return _array(pil.convert(mode))


def cover(pixels: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """fit='cover': scale (aspect kept, bilinear, antialiased, on uint8) to cover `size` -- the scaled sides rounded
    to the nearest pixel, not truncated as torchvision's Resize(int) does -- then the center crop."""
    h, w = pixels.shape[-2:]
    if (h, w) == tuple(size):
        return pixels
    scale = max(size[0] / h, size[1] / w)
    scaled = [max(size[0], round(h * scale)), max(size[1], round(w * scale))]
    return TF.center_crop(TF.resize(pixels, scaled, antialias=True), list(size))


def weigh(features: torch.Tensor, meta: dict, k: int | None = None, kind: str | None = None) -> torch.Tensor:
    """The first k features weighed so that a plain inner product is the metadata's similarity: cosine (the default)
    l2-normalizes them; spectral scales feature j by sqrt(max(lambda_j, 0)), so a small negative eigenvalue
    estimate weighs nothing (never NaN)."""
    kind = kind or meta.get("similarity", {}).get("default", "cosine")
    x = torch.as_tensor(features, dtype=torch.float32)[:, :k]
    if kind == "cosine":
        return F.normalize(x, dim=1)
    if kind == "spectral":
        eigenvalues = torch.tensor(meta["eigenvalues"][: x.shape[1]], dtype=torch.float32)
        return x * eigenvalues.clamp(min=0).sqrt()
    raise ValueError(f"similarity {kind!r} is unknown; allowed: {', '.join(SIMILARITIES)}")


def similarity(queries, items, meta: dict, k: int | None = None, kind: str | None = None) -> torch.Tensor:
    """(queries x items) scores of the first k features under the metadata's similarity (or `kind`)."""
    return weigh(queries, meta, k, kind) @ weigh(items, meta, k, kind).T
