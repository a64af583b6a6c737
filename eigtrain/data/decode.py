"""Worker-side sample handling: find the fields (configurable member names), decode to uint8 tensors, bring
images to a fixed size (center crop, or the whole image padded), collate.

Only deterministic work happens here; random augmentation runs batched on the training device
(`eigtrain.data.augment`).
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

try:  # libpng / libjpeg-turbo straight into tensors: 1.5-3x faster than PIL on small images (tools/bench_data.py)
    from torchvision.io import ImageReadMode, decode_image

    # deprecated since torchvision 0.29 in favour of TorchCodec; PIL below takes over once it is removed
    warnings.filterwarnings(
        "ignore", message="The image decoding and encoding capabilities of TorchVision", category=DeprecationWarning
    )
except ImportError:
    decode_image = None

IMAGE_EXTS = ("png", "jpg", "jpeg", "webp")
FITS = ("cover", "whole")
JPEG_MAGIC = b"\xff\xd8"


@dataclass(frozen=True)
class Corrupt:
    """A sample that could not be used: where it was and why."""

    shard: str
    key: str
    reason: str


@dataclass(frozen=True)
class DecodeSpec:
    """Which tar members a sample's fields come from and how images are decoded.

    Member names are the part after the key (``jpg``, ``x.png``, ``json``); each field lists alternatives and the
    first one a sample has is used. ``label_key`` is ``cls`` (an integer as text), ``json:FIELD`` (a field, dotted
    for nesting, of the sample's ``json`` member) or None (no labels: -1).

    ``fit``: with ``image_size`` set, ``cover`` scales an image to cover the size and takes the center crop;
    ``whole`` scales it to fit inside (aspect kept), pads by repeating the border, and reports the valid
    height and width in the sample's ``size`` so that the augmentation crops from the whole image.
    """

    mode: str  # "views": one image; "pairs": x (image) and a (image, or .npy float32 vector)
    channels: int  # 1 (grayscale) or 3 (RGB); images are converted to it on decode
    image_keys: tuple[str, ...] = IMAGE_EXTS  # views: the image; pairs: x
    label_key: str | None = None
    a_keys: tuple[str, ...] = ()  # pairs: a
    a_kind: str | None = None  # pairs mode: "image" or "vector"
    a_channels: int = 3  # pairs mode with a second image: its channel count
    image_size: tuple[int, int] | None = None  # None keeps the stored size
    fit: str = "cover"
    empty_image_shape: tuple[int, ...] = (3, 0, 0)  # shape of one image when a batch ends up empty
    empty_a_shape: tuple[int, ...] = (0,)
    defer_jpeg: bool = False  # views: hand JPEG bytes on undecoded, for a batched decode in the main process
    max_pixels: int | None = None  # data.max_image_pixels: a larger image is unusable (a counted skip), never decoded


def parse_keys(keys: str | Sequence[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """Member-name alternatives from ``"jpg;png"`` or a list; None gives `default`."""
    if keys is None:
        return default
    parts = keys.split(";") if isinstance(keys, str) else list(keys)
    items = tuple(k.strip().lstrip(".") for k in parts if k.strip())
    if not items:
        raise ValueError(f"no member names in {keys!r}")
    return items


def member(sample: dict, keys: tuple[str, ...], what: str) -> tuple[str, bytes]:
    for key in keys:
        if key in sample:
            return key, sample[key]
    fields = sorted(k for k in sample if not k.startswith("__"))
    raise KeyError(f"no {what} member {'|'.join(keys)}; the sample has {fields}")


def read_label(sample: dict, label_key: str) -> int:
    if label_key.startswith("json:"):
        _, raw = member(sample, ("json",), "json")
        value = json.loads(raw)
        for part in label_key[5:].split("."):
            if not isinstance(value, dict) or part not in value:
                raise KeyError(f"no field {label_key[5:]!r} in the json member")
            value = value[part]
    else:
        _, raw = member(sample, (label_key,), "label")
        value = raw.decode(errors="replace").strip() if isinstance(raw, bytes) else raw
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"label data.label_key={label_key} is {str(value)[:40]!r}, not an integer") from None


def resize_crop(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Scale so that the image covers `size` (aspect kept), then take the center crop."""
    h, w = image.shape[-2:]
    if (h, w) == tuple(size):
        return image
    scale = max(size[0] / h, size[1] / w)
    resized = (max(size[0], round(h * scale)), max(size[1], round(w * scale)))
    return TF.center_crop(TF.resize(image, list(resized), antialias=True), list(size))


def fit_whole(image: torch.Tensor, size: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
    """Scale the whole image to fit inside `size` (aspect kept), pad bottom/right by repeating the border;
    returns the padded image and the valid (height, width)."""
    h, w = image.shape[-2:]
    scale = min(size[0] / h, size[1] / w)
    valid = (max(1, min(size[0], round(h * scale))), max(1, min(size[1], round(w * scale))))
    if valid != (h, w):
        image = TF.resize(image, list(valid), antialias=True)
    if valid != tuple(size):
        pad = (0, size[1] - valid[1], 0, size[0] - valid[0])
        image = torch.nn.functional.pad(image[None].float(), pad, mode="replicate")[0].to(torch.uint8)
    return image, valid


def fit_image(image: torch.Tensor, size: tuple[int, int] | None, fit: str) -> tuple[torch.Tensor, tuple[int, int]]:
    """An image at `size` by `fit` (see DecodeSpec) and the valid (height, width) in it."""
    if size is None:
        return image, (image.shape[-2], image.shape[-1])
    if fit == "whole":
        return fit_whole(image, size)
    return resize_crop(image, size), (size[0], size[1])


# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they hold the image's size
SOF_MARKERS = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's start-of-frame header, None where it is not plainly there. Reading it costs
    ~1 us, opening the image in PIL ~60-100 us: at 32 px more than the decode itself."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        elif marker in SOF_MARKERS:
            h, w = int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
            return (h, w) if h and w and i + 9 <= n else None
        elif marker == 0xDA:  # the scan starts before any frame header: not a JPEG we read here
            return None
        else:
            i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def _pil_draft_decode(data: bytes, channels: int, size: tuple[int, int], fit: str) -> torch.Tensor | None:
    """JPEG much larger than `size`: decode at 1/2, 1/4 or 1/8 scale in libjpeg (DCT scaling), else None."""
    known = jpeg_size(data)
    if known is not None and (min if fit == "whole" else max)(size[0] / known[0], size[1] / known[1]) > 0.5:
        return None  # no scaled decode: PIL need not open it
    with Image.open(io.BytesIO(data)) as pil:
        w, h = pil.size
        scale = (min if fit == "whole" else max)(size[0] / h, size[1] / w)
        if scale > 0.5:
            return None
        pil.draft("L" if channels == 1 else "RGB", (math.ceil(w * scale), math.ceil(h * scale)))
        array = np.asarray(pil.convert("L" if channels == 1 else "RGB"))
    return torch.from_numpy(array.reshape(*array.shape[:2], -1).transpose(2, 0, 1).copy())


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def stored_pixels(data: bytes) -> int | None:
    """Width x height from the image's header, without decoding it (JPEG, PNG; else PIL's lazy open)."""
    if data[:2] == JPEG_MAGIC:
        known = jpeg_size(data)
        return known[0] * known[1] if known else None
    if data[:8] == PNG_MAGIC and len(data) >= 24:  # IHDR: width and height, big-endian, right after the signature
        return int.from_bytes(data[16:20], "big") * int.from_bytes(data[20:24], "big")
    try:
        with Image.open(io.BytesIO(data)) as pil:  # reads the header only
            return pil.size[0] * pil.size[1]
    except Exception:  # noqa: BLE001  (not an image PIL knows: the decode says why)
        return None


def check_pixels(data: bytes, max_pixels: int | None) -> None:
    """ValueError (the sample is unusable: a counted skip) for an image over the pixel budget, before any decode: a
    219 KB PNG can hold 15,000 x 15,000 pixels (900 MB decoded)."""
    pixels = stored_pixels(data) if max_pixels else None
    if pixels is not None and max_pixels is not None and pixels > max_pixels:
        raise ValueError(f"an image of {pixels:,} pixels, over data.max_image_pixels={max_pixels:,} (not decoded)")


def decode_image_bytes(
    data: bytes, channels: int, size: tuple[int, int] | None, fit: str = "cover", max_pixels: int | None = None
) -> torch.Tensor:
    """Encoded image -> uint8 (channels, H, W), converted to grayscale (1) or RGB (3), brought to `size` by
    `fit` (see `decode_image_sized` for the valid size with ``fit="whole"``)."""
    return decode_image_sized(data, channels, size, fit, max_pixels)[0]


def decode_image_sized(
    data: bytes, channels: int, size: tuple[int, int] | None, fit: str = "cover", max_pixels: int | None = None
) -> tuple[torch.Tensor, tuple[int, int]]:
    check_pixels(data, max_pixels)
    image = None
    if size is not None and data[:2] == JPEG_MAGIC:
        image = _pil_draft_decode(data, channels, size, fit)
    if image is None and decode_image is not None:
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
        if image.dtype != torch.uint8:  # a 16-bit PNG keeps its 16 bits here: eigtrain's images are 8-bit
            image = (image.to(torch.int32) >> 8).to(torch.uint8)
    elif image is None:
        with Image.open(io.BytesIO(data)) as pil:
            array = np.asarray(pil.convert("L" if channels == 1 else "RGB"))
        image = torch.from_numpy(array.reshape(*array.shape[:2], -1).transpose(2, 0, 1).copy())
    return fit_image(image, size, fit)


def decode_sample(sample: dict, spec: DecodeSpec) -> dict:
    """Raw tar sample -> {"key", "label", "image"[, "size"]} or {"key", "label", "x", "a"}; raises if unusable.

    With ``spec.defer_jpeg`` a JPEG image stays encoded (bytes) for `eigtrain.data.gpu_decode`.
    """
    out = {"key": sample["__key__"]}
    if spec.mode == "views":
        name, data = member(sample, spec.image_keys, "image")
        if spec.defer_jpeg and data[:2] == JPEG_MAGIC:
            check_pixels(data, spec.max_pixels)  # decoded later on the device: the budget holds there too
            out["image"], out["size"], out["url"] = bytes(data), None, sample.get("__url__", "?")
        else:
            out["image"], out["size"] = decode_image_sized(
                data, spec.channels, spec.image_size, spec.fit, spec.max_pixels
            )
    else:
        x = member(sample, spec.image_keys, "x")[1]
        out["x"] = decode_image_bytes(x, spec.channels, spec.image_size, max_pixels=spec.max_pixels)
        name, data = member(sample, spec.a_keys, "a")
        if name.endswith("npy"):
            out["a"] = torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False).astype(np.float32))
        else:
            out["a"] = decode_image_bytes(data, spec.a_channels, spec.image_size, max_pixels=spec.max_pixels)
    out["label"] = -1 if spec.label_key is None else read_label(sample, spec.label_key)
    return out


def _stack(tensors: list[torch.Tensor], name: str, empty_shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if not tensors:
        return torch.empty((0, *empty_shape), dtype=dtype)
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) > 1:
        raise ValueError(
            f"{name} tensors of one batch differ in shape {sorted(shapes)}; set image_size=(H, W) so the "
            f"workers bring every image to one size"
        )
    return torch.stack(tensors)


def collate(samples: list[dict], corrupt: list[Corrupt], spec: DecodeSpec) -> dict:
    batch = {
        "label": torch.tensor([s["label"] for s in samples], dtype=torch.int64),
        "key": [s["key"] for s in samples],
        "corrupt": corrupt,
    }
    if spec.mode == "views":
        if spec.defer_jpeg:  # finished in the main process (eigtrain.data.gpu_decode.finish_batch)
            at = [i for i, s in enumerate(samples) if isinstance(s["image"], bytes)]
            done = [s for s in samples if not isinstance(s["image"], bytes)]
            # Decoded images (PNG...) are stacked here, so the main process copies them to the device at once.
            batch["image"] = _stack([s["image"] for s in done], "image", spec.empty_image_shape, torch.uint8)
            batch["size"] = [s["size"] for s in done]
            batch["jpeg"], batch["jpeg_at"] = [samples[i]["image"] for i in at], at
            batch["url"] = [samples[i].get("url") for i in at]  # names the shard of an image nvJPEG rejects
            return batch
        batch["image"] = _stack([s["image"] for s in samples], "image", spec.empty_image_shape, torch.uint8)
        if spec.fit == "whole" and spec.image_size is not None:
            batch["size"] = torch.tensor([s["size"] for s in samples], dtype=torch.int64).view(-1, 2)
    else:
        batch["x"] = _stack([s["x"] for s in samples], "x", spec.empty_image_shape, torch.uint8)
        a_dtype = torch.float32 if spec.a_kind == "vector" else torch.uint8
        batch["a"] = _stack([s["a"] for s in samples], "a", spec.empty_a_shape, a_dtype)
    return batch
