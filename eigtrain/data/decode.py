"""Worker-side sample handling: decode encoded fields to uint8 tensors, resize/crop to a fixed size, collate.

Only deterministic work happens here; random augmentation runs batched on the training device
(`eigtrain.data.augment`).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

try:  # libpng / libjpeg-turbo straight into tensors: 1.5-3x faster than PIL on small images (tools/bench_data.py)
    from torchvision.io import ImageReadMode, decode_image

    # deprecated since torchvision 0.29 in favour of TorchCodec; PIL below takes over once it is removed
    warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                            category=DeprecationWarning)
except ImportError:
    decode_image = None

IMAGE_EXTS = ("png", "jpg", "jpeg", "webp")


@dataclass(frozen=True)
class Corrupt:
    """A sample that could not be used: where it was and why."""

    shard: str
    key: str
    reason: str


@dataclass(frozen=True)
class DecodeSpec:
    mode: str  # "views": field <image>; "pairs": fields x.<image> and a.<image> | a.npy
    channels: int  # 1 (grayscale) or 3 (RGB); images are converted to it on decode
    labels: bool  # samples carry "cls"; a sample without it is incomplete
    a_kind: str | None  # pairs mode: "image" or "vector"
    a_channels: int  # pairs mode with a second image: its channel count
    image_size: tuple[int, int] | None  # resize (shorter side) + center crop to this size; None keeps the size
    empty_image_shape: tuple[int, ...]  # shape of one image when a batch ends up empty
    empty_a_shape: tuple[int, ...]


def image_field(sample: dict, prefix: str) -> bytes:
    for ext in IMAGE_EXTS:
        if prefix + ext in sample:
            return sample[prefix + ext]
    fields = sorted(k for k in sample if not k.startswith("__"))
    raise KeyError(f"no image field {prefix}{{{','.join(IMAGE_EXTS)}}}; the sample has {fields}")


def resize_crop(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Scale so that the image covers `size` (aspect kept), then take the center crop."""
    h, w = image.shape[-2:]
    if (h, w) == tuple(size):
        return image
    scale = max(size[0] / h, size[1] / w)
    resized = (max(size[0], round(h * scale)), max(size[1], round(w * scale)))
    return TF.center_crop(TF.resize(image, list(resized), antialias=True), list(size))


def decode_image_bytes(data: bytes, channels: int, size: tuple[int, int] | None) -> torch.Tensor:
    """Encoded image -> uint8 (channels, H, W), converted to grayscale (1) or RGB (3), resized/cropped to size."""
    if decode_image is not None:
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
    else:
        with Image.open(io.BytesIO(data)) as pil:
            array = np.asarray(pil.convert("L" if channels == 1 else "RGB"))
        image = torch.from_numpy(array.reshape(*array.shape[:2], -1).transpose(2, 0, 1).copy())
    return image if size is None else resize_crop(image, size)


def decode_sample(sample: dict, spec: DecodeSpec) -> dict:
    """Raw tar sample -> {"key", "label", "image"} or {"key", "label", "x", "a"}; raises if unusable."""
    out = {"key": sample["__key__"]}
    if spec.mode == "views":
        out["image"] = decode_image_bytes(image_field(sample, ""), spec.channels, spec.image_size)
    else:
        out["x"] = decode_image_bytes(image_field(sample, "x."), spec.channels, spec.image_size)
        if spec.a_kind == "vector":
            if "a.npy" not in sample:
                raise KeyError("no field a.npy")
            out["a"] = torch.from_numpy(np.load(io.BytesIO(sample["a.npy"]), allow_pickle=False).astype(np.float32))
        else:
            out["a"] = decode_image_bytes(image_field(sample, "a."), spec.a_channels, spec.image_size)
    if spec.labels:
        if "cls" not in sample:
            raise KeyError("no field cls")
        out["label"] = int(sample["cls"])
    else:
        out["label"] = -1
    return out


def _stack(tensors: list[torch.Tensor], name: str, empty_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if not tensors:
        return torch.empty((0, *empty_shape), dtype=dtype)
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        raise ValueError(
            f"{name} tensors of one batch differ in shape {sorted(shapes)}; set image_size=(H, W) so the "
            f"workers resize and crop every image to one size"
        )
    return torch.stack(tensors)


def collate(samples: list[dict], corrupt: list[Corrupt], spec: DecodeSpec) -> dict:
    batch = {
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "key": [s["key"] for s in samples],
        "corrupt": corrupt,
    }
    if spec.mode == "views":
        batch["image"] = _stack([s["image"] for s in samples], "image", spec.empty_image_shape, torch.uint8)
    else:
        batch["x"] = _stack([s["x"] for s in samples], "x", spec.empty_image_shape, torch.uint8)
        a_dtype = torch.float32 if spec.a_kind == "vector" else torch.uint8
        batch["a"] = _stack([s["a"] for s in samples], "a", spec.empty_a_shape, a_dtype)
    return batch
