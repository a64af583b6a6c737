"""Batched augmentation on the training device, with random parameters drawn per sample.

    augment = build_augment("cifar", image_size=(32, 32))
    view1, view2 = augment(images_uint8, generator=torch.Generator(device).manual_seed(0))

Every random number comes from the `generator` passed in (the global RNG of the images' device when it is None),
a fixed number of draws per call whatever the data, so the trainer's RNG state in a checkpoint makes the views
bit-identical after a resume on CPU. The semantics follow torchvision's transforms (RandomResizedCrop,
RandomHorizontalFlip, ColorJitter with a random order of its four operations per sample, RandomGrayscale,
GaussianBlur, RandomSolarize); crops are continuous boxes sampled by grid_sample (no antialiasing, so keep the
stored or worker-resized images close to the output size).

Presets (view 1, view 2):
- ``cifar``: crop scale 0.2-1, flip, color jitter 0.4/0.4/0.4/0.1 with p 0.8, grayscale p 0.2; both views alike.
- ``imagenet``: the VICReg recipe: crop scale 0.08-1 (bicubic), flip, jitter 0.4/0.4/0.2/0.1 with p 0.8,
  grayscale p 0.2, Gaussian blur sigma 0.1-2 with p 1.0 / 0.1, solarization p 0.0 / 0.2.
- ``digits``: small crops (scale 0.7-1, aspect 0.8-1.25) of 8x8 digits, i.e. shifts and zooms of about a
  pixel; no flip (digits are not mirror-symmetric), no color.
- ``none``: no augmentation (the two views are equal); resize only if `image_size` differs.
then normalization ``(x / 255 - mean) / std``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kornia.filters import gaussian_blur2d
from torch import nn

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize default, as in VICReg
_HUE_OFFSETS = torch.tensor([5.0, 3.0, 1.0]).view(1, 3, 1, 1)


@dataclass(frozen=True)
class ViewRecipe:
    crop_scale: tuple[float, float] | None = (0.08, 1.0)  # None: no crop, only resize to the output size
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter: tuple[float, float, float, float] | None = None  # brightness, contrast, saturation, hue
    jitter_p: float = 0.8
    gray_p: float = 0.0
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    interpolation: str = "bilinear"


_CIFAR = ViewRecipe(crop_scale=(0.2, 1.0), jitter=(0.4, 0.4, 0.4, 0.1), gray_p=0.2)
_VICREG = dict(crop_scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), gray_p=0.2, interpolation="bicubic")
_NONE = ViewRecipe(crop_scale=None, flip_p=0.0)

PRESETS: dict[str, tuple[ViewRecipe, ViewRecipe]] = {
    "cifar": (_CIFAR, _CIFAR),
    "imagenet": (ViewRecipe(**_VICREG, blur_p=1.0, solarize_p=0.0), ViewRecipe(**_VICREG, blur_p=0.1, solarize_p=0.2)),
    "digits": (ViewRecipe(crop_scale=(0.7, 1.0), crop_ratio=(0.8, 1.25), flip_p=0.0),) * 2,
    "none": (_NONE, _NONE),
}
NORMALIZATION = {  # (mean, std) per channel
    "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "digits": ((0.3053,), (0.3759,)),  # measured on scikit-learn's digits scaled to 0..1
    "none": ((0.5,), (0.5,)),  # broadcast over any number of channels
}


def build_augment(
    preset: str,
    image_size: int | tuple[int, int] | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
) -> "BatchAugment":
    """The augmentation module of a preset; `image_size` is the output size (None: the input size)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown augmentation preset {preset!r}; allowed: {sorted(PRESETS)}")
    default_mean, default_std = NORMALIZATION[preset]
    return BatchAugment(PRESETS[preset], image_size, mean or default_mean, std or default_std)


class BatchAugment(nn.Module):
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

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None,
                sizes: torch.Tensor | None = None):
        """Two augmented views, float32 (B, C, H', W'), normalized."""
        return self.view(images, generator, 0, sizes), self.view(images, generator, 1, sizes)

    @torch.no_grad()
    def view(self, images: torch.Tensor, generator: torch.Generator | None = None, index: int = 0,
             sizes: torch.Tensor | None = None) -> torch.Tensor:
        """One augmented view (recipe `index` of the preset) of a uint8 batch (B, C, H, W).

        `sizes` (B, 2): each image's valid height and width at the top left of a padded batch (ShardStream with
        ``image_fit="whole"``); crops are then drawn from that region (without a crop: its center crop)."""
        if images.ndim != 4 or images.dtype != torch.uint8:
            raise ValueError(f"expected a uint8 batch (B, C, H, W), got {images.dtype} {list(images.shape)}")
        channels = images.shape[1]
        if self.mean.shape[1] not in (1, channels):
            raise ValueError(f"images have {channels} channels but mean/std have {self.mean.shape[1]} values")
        recipe = self.views[index]
        rand = _Sampler(generator, images.device, images.shape[0])
        x = images.float().div_(255)
        x = crop_flip_resize(x, recipe, self.image_size or tuple(images.shape[-2:]), rand, sizes)
        if recipe.jitter is not None:
            x = color_jitter(x, recipe.jitter, recipe.jitter_p, rand)
        if recipe.gray_p > 0 and channels == 3:
            x = torch.where(rand.bernoulli(recipe.gray_p)[:, None, None, None], gray(x).expand_as(x), x)
        if recipe.blur_p > 0:
            x = gaussian_blur(x, recipe.blur_p, recipe.blur_sigma, rand)
        if recipe.solarize_p > 0:
            flip = rand.bernoulli(recipe.solarize_p)[:, None, None, None] & (x >= SOLARIZE_THRESHOLD)
            x = torch.where(flip, 1 - x, x)
        return (x - self.mean) / self.std


class _Sampler:
    """Per-sample random numbers from one generator, on the generator's device, moved to the data's."""

    def __init__(self, generator: torch.Generator | None, device: torch.device, batch: int):
        self.generator, self.device, self.batch = generator, device, batch
        self.source = generator.device if generator is not None else device

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        u = torch.rand((self.batch, *shape), generator=self.generator, device=self.source)
        return (lo + (hi - lo) * u).to(self.device)

    def bernoulli(self, p: float) -> torch.Tensor:
        return self.uniform(0.0, 1.0) < p


def gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(1)


def crop_flip_resize(x: torch.Tensor, recipe: ViewRecipe, size: tuple[int, int], rand: _Sampler,
                     sizes: torch.Tensor | None = None) -> torch.Tensor:
    """RandomResizedCrop + horizontal flip as one batched affine resampling (torchvision's crop distribution:
    ten tries of scale and log-uniform aspect ratio, then a central fallback). With `sizes`, each image's crop
    comes from its own valid (height, width) region at the top left of the batch."""
    if sizes is not None:
        return _crop_in_valid_region(x, recipe, size, rand, sizes)
    B, _, H, W = x.shape
    if recipe.crop_scale is None:
        if (H, W) == tuple(size):
            return x
        return F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False).clamp_(0, 1)
    area = H * W * rand.uniform(*recipe.crop_scale, 10)
    aspect = torch.exp(rand.uniform(math.log(recipe.crop_ratio[0]), math.log(recipe.crop_ratio[1]), 10))
    w, h = torch.sqrt(area * aspect), torch.sqrt(area / aspect)
    fits = (w <= W) & (h <= H)
    first = fits.float().argmax(1, keepdim=True)  # the first try that fits, as torchvision does
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    fallback_w = min(W, H * recipe.crop_ratio[1])
    fallback_h = min(H, W / recipe.crop_ratio[0])
    any_fit = fits.any(1)
    w = torch.where(any_fit, w, torch.full_like(w, fallback_w))
    h = torch.where(any_fit, h, torch.full_like(h, fallback_h))
    corner = rand.uniform(0.0, 1.0, 2)
    x0 = torch.where(any_fit, corner[:, 0] * (W - w), (W - w) / 2)
    y0 = torch.where(any_fit, corner[:, 1] * (H - h), (H - h) / 2)
    sign = torch.where(rand.bernoulli(recipe.flip_p), -1.0, 1.0)
    theta = torch.zeros(B, 2, 3, device=x.device)
    theta[:, 0, 0] = sign * w / W  # normalized coordinates: output [-1, 1] -> crop box in the input
    theta[:, 0, 2] = (2 * x0 + w) / W - 1
    theta[:, 1, 1] = h / H
    theta[:, 1, 2] = (2 * y0 + h) / H - 1
    grid = F.affine_grid(theta, [B, x.shape[1], *size], align_corners=False)
    out = F.grid_sample(x, grid, mode=recipe.interpolation, padding_mode="reflection", align_corners=False)
    return out.clamp_(0, 1)  # bicubic overshoots


def _crop_in_valid_region(x: torch.Tensor, recipe: ViewRecipe, size: tuple[int, int], rand: _Sampler,
                          sizes: torch.Tensor) -> torch.Tensor:
    """crop_flip_resize with a per-sample image size (same random draws, so the generator advances alike)."""
    B, _, canvas_h, canvas_w = x.shape
    sizes = sizes.to(x.device, torch.float32)
    H, W = sizes[:, 0], sizes[:, 1]
    if recipe.crop_scale is None:  # the largest centered box with the output's aspect ratio (resize + center crop)
        aspect = size[1] / size[0]
        w = torch.minimum(W, H * aspect)
        h = w / aspect
        x0, y0, sign = (W - w) / 2, (H - h) / 2, torch.ones_like(w)
    else:
        area = (H * W)[:, None] * rand.uniform(*recipe.crop_scale, 10)
        aspect = torch.exp(rand.uniform(math.log(recipe.crop_ratio[0]), math.log(recipe.crop_ratio[1]), 10))
        w, h = torch.sqrt(area * aspect), torch.sqrt(area / aspect)
        fits = (w <= W[:, None]) & (h <= H[:, None])
        first = fits.float().argmax(1, keepdim=True)
        w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
        any_fit = fits.any(1)
        w = torch.where(any_fit, w, torch.minimum(W, H * recipe.crop_ratio[1]))
        h = torch.where(any_fit, h, torch.minimum(H, W / recipe.crop_ratio[0]))
        corner = rand.uniform(0.0, 1.0, 2)
        x0 = torch.where(any_fit, corner[:, 0] * (W - w), (W - w) / 2)
        y0 = torch.where(any_fit, corner[:, 1] * (H - h), (H - h) / 2)
        sign = torch.where(rand.bernoulli(recipe.flip_p), -1.0, 1.0)
    theta = torch.zeros(B, 2, 3, device=x.device)
    theta[:, 0, 0] = sign * w / canvas_w  # normalized coordinates of the whole (padded) batch
    theta[:, 0, 2] = (2 * x0 + w) / canvas_w - 1
    theta[:, 1, 1] = h / canvas_h
    theta[:, 1, 2] = (2 * y0 + h) / canvas_h - 1
    grid = F.affine_grid(theta, [B, x.shape[1], *size], align_corners=False)
    mode = recipe.interpolation if recipe.crop_scale is not None else "bilinear"
    out = F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False)
    return out.clamp_(0, 1)


def _brightness(x, f):
    return (x * f).clamp_(0, 1)


def _contrast(x, f):
    mean = gray(x).mean(dim=(1, 2, 3), keepdim=True)
    return (f * x + (1 - f) * mean).clamp_(0, 1)


def _saturation(x, f):
    return (f * x + (1 - f) * gray(x)).clamp_(0, 1)


def _hue(x, f):
    """Rotate the hue by f turns, as torchvision's adjust_hue (RGB -> HSV -> RGB) in fewer passes."""
    maxc, argmax = x.max(dim=1, keepdim=True)
    delta = maxc - x.amin(dim=1, keepdim=True)  # = value * saturation
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    r, g, b = x.split(1, dim=1)
    sextant = torch.where(argmax == 0, (g - b) / safe, torch.where(argmax == 1, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = torch.remainder(torch.where(delta > 0, sextant, torch.zeros_like(sextant)) + 6 * f, 6)
    # HSV -> RGB without branches: channel n in (r, g, b) = v - v*s*clamp(min(k, 4 - k), 0, 1), k = (n' + h) mod 6
    k = torch.remainder(_HUE_OFFSETS.to(x.device) + hue, 6)
    return (maxc - delta * torch.clamp(torch.minimum(k, 4 - k), 0, 1)).clamp_(0, 1)


def color_jitter(x: torch.Tensor, strength: tuple[float, float, float, float], p: float, rand: _Sampler):
    """ColorJitter applied with probability p, each sample with its own factors and its own order of the ops."""
    b, c, s, h = strength
    factors = [rand.uniform(max(0.0, 1 - b), 1 + b), rand.uniform(max(0.0, 1 - c), 1 + c),
               rand.uniform(max(0.0, 1 - s), 1 + s), rand.uniform(-h, h)]
    order = torch.argsort(rand.uniform(0.0, 1.0, 4), dim=1)
    apply = rand.bernoulli(p)
    ops = [_brightness, _contrast, _saturation, _hue]
    active = [b > 0, c > 0, s > 0 and x.shape[1] == 3, h > 0 and x.shape[1] == 3]
    for step in range(4):
        for op in range(4):
            if not active[op]:
                continue
            # Computed for the whole batch and selected per sample: indexing the chosen samples (torch.nonzero)
            # would wait for the GPU on every call.
            chosen = (apply & (order[:, step] == op)).view(-1, 1, 1, 1)
            x = torch.where(chosen, ops[op](x, factors[op].view(-1, 1, 1, 1)), x)
    return x


def gaussian_blur(x: torch.Tensor, p: float, sigma_range: tuple[float, float], rand: _Sampler) -> torch.Tensor:
    sigma = rand.uniform(*sigma_range)
    apply = rand.bernoulli(p)
    if p <= 0:
        return x
    radius = min(math.ceil(3 * sigma_range[1]), min(x.shape[-2:]) - 1)  # 3 sigma, within reflect-padding limits
    # Blurred for the whole batch and selected per sample (no torch.nonzero: no wait for the GPU).
    blurred = gaussian_blur2d(x, 2 * radius + 1, sigma[:, None].expand(-1, 2).contiguous())
    return torch.where(apply.view(-1, 1, 1, 1), blurred, x)
