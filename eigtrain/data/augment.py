"""Batched augmentation on the training device, with random parameters drawn per sample.

    augment = build_augment("cifar", image_size=(32, 32))
    view1, view2 = augment(images_uint8, generator=torch.Generator(device).manual_seed(0))

Every random number comes from the `generator` passed in (the global RNG of the images' device when it is None;
a list of CPU generators, one per sample, makes each sample's views independent of its batch), one block of
`Sampler.BLOCK` numbers per sample and view whatever the data, so the trainer's RNG state in a checkpoint makes the views
bit-identical after a resume on CPU. The semantics follow torchvision's transforms (RandomResizedCrop,
RandomHorizontalFlip, ColorJitter with a random order of its four operations per sample, RandomGrayscale,
GaussianBlur, RandomSolarize). Two paths with the same draws:
- on an accelerator, a pure function of (images, random block) (`augment_batched`, compiled into one graph per
  view with `compile`): every operation runs on the whole batch and torch.where keeps it per sample (no host
  synchronisation); crops are continuous boxes resampled by one grid_sample (no antialiasing, so keep the stored
  or worker-resized images close to the output size);
- on the CPU, cache-sized chunks, each operation only on the samples that drew it; outputs above 64x64 are
  cropped with whole-pixel boxes resized with antialiasing in uint8, as torchvision does (`tools/bench_loader.py`:
  1.8x the per-core throughput of webdataset + per-image torchvision v2 at 96 and 224 px).

Presets: `eigtrain.data.augment_recipes`; then normalization ``(x / 255 - mean) / std``.
The random draws are `augment_draws`, the operations `augment_ops`.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import torch
from torch import nn

from eigtrain.data.augment_batched import batched_view, compiled_view
from eigtrain.data.augment_draws import Draws, Generators, Sampler, draw
from eigtrain.data.augment_ops import colour_blur_solarize, crop_one, resample, select
from eigtrain.data.augment_recipes import NORMALIZATION, PRESETS, ViewRecipe


def build_augment(
    preset: str,
    image_size: int | Sequence[int] | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    *,
    compile: bool = False,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> "BatchAugment":
    """The augmentation module of a preset; `image_size` is the output size (None: the input size). compile: the
    accelerator path as one compiled graph per view (`augment_batched`); dtype, channels_last: the views' dtype and
    memory layout (bf16 channels_last for a bf16 convolutional encoder: autocast would cast them anyway)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown augmentation preset {preset!r}; allowed: {sorted(PRESETS)}")
    default_mean, default_std = NORMALIZATION[preset]
    augment = BatchAugment(PRESETS[preset], image_size, mean or default_mean, std or default_std)
    augment.preset, augment.normalization_given = preset, mean is not None
    augment.compile_views, augment.dtype, augment.channels_last = compile, dtype, channels_last
    return augment


class BatchAugment(nn.Module):
    compile_views = False  # the accelerator path compiled (`build_augment`; not nn.Module.compile)
    preset = "?"  # the preset's name and whether mean/std were given: for the message of a channel mismatch
    normalization_given = True
    dtype = torch.float32  # the views' dtype
    channels_last = False  # the views' memory layout
    mean: torch.Tensor  # buffers (1, C, 1, 1)
    std: torch.Tensor

    def __init__(self, views: tuple[ViewRecipe, ViewRecipe], image_size, mean, std):
        super().__init__()
        if len(mean) != len(std):
            raise ValueError(f"mean has {len(mean)} values but std has {len(std)}")
        if min(std) <= 0:
            raise ValueError(f"std must be positive, got {std}")
        self.views = views
        self.image_size = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor, generator: Generators = None, sizes: torch.Tensor | None = None):
        """Two augmented views, float32 (B, C, H', W'), normalized."""
        return self.view(images, generator, 0, sizes), self.view(images, generator, 1, sizes)

    @torch.no_grad()
    def view(
        self,
        images: torch.Tensor,
        generator: Generators = None,
        index: int = 0,
        sizes: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One augmented view (recipe `index` of the preset) of a uint8 batch (B, C, H, W).

        `sizes` (B, 2): each image's valid height and width at the top left of a padded batch (ShardStream with
        ``image_fit="whole"``); crops are then drawn from that region (without a crop: its center crop)."""
        if images.ndim != 4 or images.dtype != torch.uint8:
            raise ValueError(f"expected a uint8 batch (B, C, H, W), got {images.dtype} {list(images.shape)}")
        self._check_channels(images.shape[1])
        recipe = self.views[index]
        size = self.image_size or tuple(images.shape[-2:])
        block = Sampler(generator, images.device, images.shape[0]).random_block()  # the view's random numbers
        if host_reads_are_free(images.device) and not (recipe.crop_scale is None and sizes is None):
            draws = draw(recipe, Sampler.from_block(block), images.shape, size, sizes)
            x = self._view_per_image(images, recipe, draws, size, sizes).to(self.dtype)
            return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x
        return self.batched(images, block, index, sizes)

    @torch.no_grad()
    def batched(
        self, images: torch.Tensor, block: torch.Tensor, index: int = 0, sizes: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The accelerator path of view `index` from its random block: every operation on the whole batch, kept per
        sample with `where` (no host synchronisation); compiled into one graph when `compile_views` is set."""
        size = tuple(self.image_size or images.shape[-2:])
        recipe, options = self.views[index], (size, self.dtype, self.channels_last)
        if self.compile_views:
            try:
                return compiled_view(recipe, *options)(images, block, sizes, self.mean, self.std)
            except Exception as exn:  # a compiler that fails here must not stop training: the same views, eager
                warnings.warn(f"augmentation not compiled ({type(exn).__name__}: {str(exn)[:200]}); running eager")
                self.compile_views = False
        return batched_view(images, block, sizes, self.mean, self.std, recipe=recipe, size=size, dtype=self.dtype,
                            channels_last=self.channels_last)  # fmt: skip

    def _view_per_image(self, images, recipe: ViewRecipe, draws: "Draws", size, sizes) -> torch.Tensor:
        """The CPU path: per-sample operations on cache-sized chunks, each computed only for the samples that drew
        it. Outputs above 64x64 are cropped with whole-pixel boxes resized with antialiasing in uint8 (as
        torchvision does, ~10x faster than resampling); smaller ones keep the continuous boxes of the batched
        path (whole pixels would leave an 8x8 digit a handful of distinct crops)."""
        B, C = images.shape[:2]
        out = torch.empty(B, C, *size, dtype=torch.float32)
        chunk = max(1, _CHUNK_BYTES // (4 * C * size[0] * size[1]))
        small = size[0] * size[1] <= _SMALL_OUTPUT
        if small:
            resampled = resample(images.float().div_(255), recipe, draws, size, sizes)
        host = draws.to_host()
        for start in range(0, B, chunk):
            stop = min(start + chunk, B)
            rows = host.rows(start, stop)
            if small:
                x = resampled[start:stop]
            else:
                crops = [
                    crop_one(images[start + i], region, box, flip, size, recipe)
                    for i, (region, box, flip) in enumerate(zip(rows.region, rows.boxes, rows.flip))
                ]
                x = torch.stack(crops).float().div_(255)
            out[start:stop] = self._normalize(colour_blur_solarize(x, recipe, rows, select))
        return out

    def _check_channels(self, channels: int) -> None:
        values = self.mean.shape[1]
        if values in (1, channels):
            return
        if self.normalization_given:
            raise ValueError(f"images have {channels} channels but mean/std have {values} values")
        fits = sorted(
            name
            for name, (mean, _) in NORMALIZATION.items()
            if len(mean) == channels and name not in ("digits", "none")
        )
        raise ValueError(
            f"images have {channels} channel(s) but augmentation preset {self.preset!r} normalizes {values}: use "
            f"data.augment={' or '.join(fits) or 'none'} or give data.mean and data.std with {channels} value(s) each"
        )

    def _normalize(self, x):
        return (x - self.mean) / self.std


_CHUNK_BYTES = 1 << 20  # float32 images per chunk on the CPU: the working set stays in the L2 cache
_SMALL_OUTPUT = 64 * 64  # CPU outputs up to this many pixels keep continuous crop boxes


def host_reads_are_free(device: torch.device) -> bool:
    """On the CPU, reading random draws back to Python costs nothing, so each operation runs only on the samples
    that drew it; on an accelerator every operation runs on the whole batch and `torch.where` picks per sample,
    so augmentation never waits for the device. (A test forces the accelerator path on the CPU.)"""
    return device.type == "cpu"
