"""What a trained run does to an image from decode to its encoder, in one place: the mean/std it normalizes by (as recorded), the
size its images are decoded to (which eigtrain-embed, -rr and -eval bring every image to), and the whole chain as
the standalone file's `preprocess` spec (eigtrain.export.preprocess.reference_transform implements it)."""

from __future__ import annotations

import dataclasses

from eigtrain.data.index import read_index
from eigtrain.schema import DataConfig

SIMILARITY = {
    "default": "cosine",
    "cosine": "cosine of the first k features (l2-normalize f[:, :k], then inner product): the default",
    "spectral": "s(x, y) = sum_{j<k} max(lambda_j, 0) f_j(x) f_j(y), lambda = 'eigenvalues': scale feature j by "
    "sqrt(max(lambda_j, 0)), then inner product; a negative eigenvalue estimate weighs nothing",
    "why": "the features are whitened (unit variance each): a plain inner product weighs every eigenfunction alike",
}


def normalization(run) -> dict:
    """build_augment's mean= and std=: what the run trained with (its model.json's record, eigtrain.data.normalization;
    `run`: an eigtrain.export.embed.TrainedRun)."""
    return run.normalization.kwargs()


def decoded_size(data: DataConfig, input_shape) -> list[int] | None:
    """The (H, W) the run's data workers gave its images: data.image_size; else as stored, which is the encoder's
    input without a view resize, else data.root's fixed image shape; None where that is not known."""
    if data.image_size:
        return [int(s) for s in data.image_size]
    if not data.view_size:
        return [int(s) for s in input_shape[1:]]
    try:
        shape = read_index(data.root).meta.get("image_shape") if data.root else None
    except (OSError, ValueError, KeyError):
        shape = None
    return [int(s) for s in shape[1:]] if shape else None


def sized(data: DataConfig, input_shape) -> DataConfig:
    """`data` with image_size set to `decoded_size`: an image of another size than the run's (a corpus of raw
    images) is brought to it as training brought its own, never encoded at a resolution the model did not see."""
    size = None if data.image_size else decoded_size(data, input_shape)
    return dataclasses.replace(data, image_size=size) if size else data


def preprocess_spec(data: DataConfig, input_shape, norm: dict) -> dict:
    """The run's preprocessing as the standalone file's metadata states it (docs/export.md)."""
    channels, size = int(input_shape[0]), decoded_size(data, input_shape)
    mean, std = (list(v) * (channels if len(v) == 1 else 1) for v in (norm["mean"], norm["std"]))
    view = [int(s) for s in data.view_size] if data.view_size else None
    view_resize = None  # the view is the decoded image: eigtrain resizes nothing more
    if view is not None and view != size:
        view_resize = {"size": view, "interpolation": "bilinear", "antialias": True, "keep_aspect": False}
        view_resize["clamp"] = [0.0, 1.0]
    resize = None
    if size:
        rule = "scale = max(H/h, W/w); resize to (max(H, round(h*scale)), max(W, round(w*scale))); center crop (H, W)"
        resize = {"size": size, "fit": data.image_fit, "rule": rule, "interpolation": "bilinear", "antialias": True}
        resize["on"] = "uint8, skipped when the image is (H, W) already"
    return {
        "channels": channels,
        "channel_order": "L" if channels == 1 else "RGB",
        "decode": "torchvision.io.decode_image, mode GRAY (L) or RGB; 16-bit: the top 8 bits; a JPEG at least twice "
        "the resize size each way: PIL Image.draft(mode, (ceil(w*scale), ceil(h*scale))) first",
        "resize": resize,
        "to_float": "x / 255 (float32)",
        "view_resize": view_resize,
        "mean": mean,
        "std": std,
        "normalize": "(x - mean) / std, inside the model",
        "input_size": [int(s) for s in input_shape[1:]],
    }
