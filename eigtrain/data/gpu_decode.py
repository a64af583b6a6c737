"""Batched JPEG decoding on the training device: nvJPEG through ``torchvision.io.decode_jpeg(device="cuda")``.

``data.decode=cpu`` (the default until a GPU run shows this path bit-identical to CPU decoding on the same
batch) decodes in the DataLoader workers. With ``auto`` (a CUDA run whose torchvision decodes a probe JPEG on
the GPU) or ``cuda``, the workers leave only JPEG bytes undecoded: every other image (PNG shards) they decode
and stack, and the main process copies that stack to the device once (pinned, non-blocking) and decodes the
JPEGs in one batched call. The same code runs on the CPU (``jpeg_device="cpu"``), which is how it is tested.
A batch that nvJPEG rejects is decoded image by image to find the unusable ones, which are counted like any
other corrupt sample.

Stream ordering: torchvision allocates the decoded images on the current stream but writes them from its own
stream, which does not wait for the current one; on the training stream the allocator may hand it memory that
queued kernels (the previous step's backward) still read. `JpegDecoder` therefore decodes with a dedicated
stream current: only decoded images are ever freed into that stream's memory pool, each marked used by the
training stream (`record_stream`), so the allocator reuses such a block only once the training stream is done
with it; the training stream then waits for the decode stream (`wait_stream`) before it reads the images. In training,
`eigtrain.data.decode_ahead` calls `finish_batch` on a background thread with its own stream current, which is
then the "training stream" of this paragraph; it hands each batch to the training stream the same way.
"""

from __future__ import annotations

import functools

import torch

from eigtrain.data.decode import Corrupt, DecodeSpec, fit_image

DECODE_CHOICES = ("auto", "cpu", "cuda")


@functools.lru_cache(maxsize=None)
def nvjpeg_problem(device: str = "cuda") -> str | None:
    """Why JPEGs cannot be decoded on `device` (None: they can): decodes one tiny JPEG there once per process.
    (Importing `decode_jpeg` is not enough: a torchvision built without nvJPEG imports it and then fails on
    every image, which would mark every sample corrupt.)"""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device is visible"
    try:
        from torchvision.io import decode_jpeg, encode_jpeg

        probe = encode_jpeg(torch.full((3, 8, 8), 128, dtype=torch.uint8))
        decoded = decode_jpeg([probe], device=device)[0]
        if tuple(decoded.shape) != (3, 8, 8):
            return f"the probe JPEG decoded to shape {tuple(decoded.shape)}, not (3, 8, 8)"
    except Exception as exn:  # ImportError, or "not compiled with nvJPEG", or a CUDA error
        return f"torchvision cannot decode a JPEG on {device}: {type(exn).__name__}: {exn}".strip()
    return None


def nvjpeg_available(device: str = "cuda") -> bool:
    return nvjpeg_problem(device) is None


SMALL_IMAGE_PX = 64  # data.decode=auto: images of at most this many pixels a side are decoded in the workers


def choose_jpeg_device(
    setting: str, device: torch.device | str, image_size: list[int] | None = None
) -> torch.device | None:
    """Where JPEGs are decoded in batches (None: in the DataLoader workers, on the CPU). ``auto`` keeps small images
    (data.image_size at most `SMALL_IMAGE_PX` a side) in the workers: nvJPEG's per-image cost on the launching
    thread (~45 us) outweighs their decode (the H200 run of 2026-11-26: JPEG shards 31 % of the bare ResNet-18 at
    32 px with nvJPEG, PNG decoded in the workers 44-57 %)."""
    if setting not in DECODE_CHOICES:
        raise ValueError(f"data.decode={setting!r} is not allowed; allowed: {', '.join(DECODE_CHOICES)}")
    device = torch.device(device)
    if setting == "cpu":
        return None
    if setting == "cuda":
        problem = "the run is not on a CUDA device" if device.type != "cuda" else nvjpeg_problem(str(device))
        if problem:
            raise ValueError(
                f"data.decode=cuda needs torchvision's nvJPEG decoder on the run's CUDA device, but "
                f"{problem}; use data.decode=cpu"
            )
        return device
    if image_size and max(image_size) <= SMALL_IMAGE_PX:
        return None
    return device if device.type == "cuda" and nvjpeg_available(str(device)) else None


def decode_jpegs(data: list[bytes], channels: int, device: torch.device) -> list[torch.Tensor]:
    """One batched decode call; raises if any image cannot be decoded."""
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    encoded = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in data]
    return decode_jpeg(encoded, mode=mode, device=device)


class JpegDecoder:
    """`decode_jpegs` on `device`, on CUDA ordered against the training stream (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __call__(self, data: list[bytes], channels: int) -> list[torch.Tensor]:
        if self.stream is None:
            return decode_jpegs(data, channels, self.device)
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            images = decode_jpegs(data, channels, self.device)
        consumer.wait_stream(self.stream)
        for image in images:
            image.record_stream(consumer)
        return images


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One host-to-device copy that does not wait for the device's queue (pinned memory, non-blocking)."""
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def finish_batch(batch: dict, spec: DecodeSpec, device: torch.device, decoder: JpegDecoder | None = None) -> dict:
    """A batch from the workers (JPEG bytes and the stack of the images they decoded) -> the usual batch: every
    image on `device`, in batch order; unusable JPEGs are dropped and counted in ``batch["corrupt"]``."""
    device = torch.device(device)
    decoder = decoder or JpegDecoder(device)
    jpeg, at, urls = batch.pop("jpeg"), batch.pop("jpeg_at"), batch.pop("url")
    decoded: dict[int, torch.Tensor] = {}
    if jpeg:
        try:
            decoded = dict(zip(at, decoder(jpeg, spec.channels)))
        except Exception:  # find the unusable image(s); the rest are decoded one by one
            for i, data, url in zip(at, jpeg, urls):
                try:
                    decoded[i] = decoder([data], spec.channels)[0]
                except Exception as exn:
                    batch["corrupt"].append(Corrupt(url or "?", batch["key"][i], f"{type(exn).__name__}: {exn}"))
    moved = to_device(batch["image"], device)  # the workers' stack: one copy for all of them
    others = iter(moved.unbind(0))
    other_sizes = iter(batch.pop("size"))
    jpeg_at = set(at)
    keep, images, sizes = [], [], []
    for i in range(len(batch["key"])):
        if i in decoded:
            image, size = fit_image(decoded[i], spec.image_size, spec.fit)
        elif i in jpeg_at:
            continue  # undecodable: counted above
        else:
            image, size = next(others), next(other_sizes)
        keep.append(i)
        images.append(image)
        sizes.append(size)
    shape = {tuple(t.shape) for t in images}
    if len(shape) > 1:
        raise ValueError(f"image tensors of one batch differ in shape {sorted(shape)}; set image_size=(H, W)")
    if not jpeg:
        batch["image"] = moved  # no JPEG in the batch (PNG shards): nothing to re-stack
    elif images:
        batch["image"] = torch.stack(images)
    else:
        batch["image"] = torch.empty((0, *spec.empty_image_shape), dtype=torch.uint8, device=device)
    if len(keep) < len(batch["key"]):
        batch["label"], batch["key"] = batch["label"][keep], [batch["key"][i] for i in keep]
    if spec.fit == "whole" and spec.image_size is not None:
        batch["size"] = torch.tensor(sizes, dtype=torch.int64).view(-1, 2)
    return batch
