"""Batched JPEG decoding on the training device: nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``.

With ``data.decode=auto`` (the default) it is used when the run trains on CUDA and torchvision can decode on
it; the workers then only read and group tar members and leave JPEG bytes undecoded (other formats they
still decode), and the main process decodes each batch in one call on the GPU. ``data.decode=cpu`` keeps
decoding in the workers. The same code runs on the CPU (``jpeg_device="cpu"``), which is how it is tested.
A batch that nvJPEG rejects is decoded image by image to find the unusable ones, which are counted like any
other corrupt sample.
"""

from __future__ import annotations

import torch

from .decode import Corrupt, DecodeSpec, fit_image

DECODE_CHOICES = ("auto", "cpu", "cuda")


def nvjpeg_available() -> bool:
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def choose_jpeg_device(setting: str, device: torch.device | str) -> torch.device | None:
    """Where JPEGs are decoded in batches (None: in the DataLoader workers, on the CPU)."""
    if setting not in DECODE_CHOICES:
        raise ValueError(f"data.decode={setting!r} is not allowed; allowed: {', '.join(DECODE_CHOICES)}")
    device = torch.device(device)
    if setting == "cpu":
        return None
    if setting == "cuda":
        if device.type != "cuda" or not nvjpeg_available():
            raise ValueError("data.decode=cuda needs a run on a CUDA device with torchvision's nvJPEG decoder; "
                             "use data.decode=auto or cpu")
        return device
    return device if device.type == "cuda" and nvjpeg_available() else None


def decode_jpegs(data: list[bytes], channels: int, device: torch.device) -> list[torch.Tensor]:
    """One batched decode call; raises if any image cannot be decoded."""
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    encoded = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in data]
    return decode_jpeg(encoded, mode=mode, device=device)


def finish_batch(batch: dict, spec: DecodeSpec, device: torch.device) -> dict:
    """A batch whose images are JPEG bytes (or tensors the workers decoded) -> the usual batch, on `device`."""
    items, urls = batch["image"], batch.pop("url", None) or [None] * len(batch["image"])
    jpeg = [i for i, item in enumerate(items) if isinstance(item, (bytes, bytearray))]
    decoded: dict[int, torch.Tensor] = {}
    if jpeg:
        try:
            decoded = dict(zip(jpeg, decode_jpegs([items[i] for i in jpeg], spec.channels, device)))
        except Exception:  # find the unusable image(s); the rest are decoded one by one
            for i in jpeg:
                try:
                    decoded[i] = decode_jpegs([items[i]], spec.channels, device)[0]
                except Exception as exn:
                    batch["corrupt"].append(Corrupt(urls[i] or "?", batch["key"][i], f"{type(exn).__name__}: {exn}"))
    keep, images, sizes = [], [], []
    for i, item in enumerate(items):
        if i in decoded:
            image, size = fit_image(decoded[i], spec.image_size, spec.fit)
        elif i in jpeg:
            continue  # undecodable: counted above
        else:
            image, size = item.to(device), batch["size"][i]
        keep.append(i)
        images.append(image)
        sizes.append(size)
    shape = {tuple(t.shape) for t in images}
    if len(shape) > 1:
        raise ValueError(f"image tensors of one batch differ in shape {sorted(shape)}; set image_size=(H, W)")
    batch["image"] = torch.stack(images) if images else torch.empty((0, *spec.empty_image_shape), dtype=torch.uint8,
                                                                    device=device)
    batch["label"], batch["key"] = batch["label"][keep], [batch["key"][i] for i in keep]
    if spec.fit == "whole" and spec.image_size is not None:
        batch["size"] = torch.tensor(sizes, dtype=torch.int64).view(-1, 2)
    else:
        batch.pop("size", None)
    return batch
