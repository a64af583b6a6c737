"""Batched augmentation on the training device, with random parameters drawn per sample.

    augment = build_augment("cifar", image_size=(32, 32))
    view1, view2 = augment(images_uint8, generator=torch.Generator(device).manual_seed(0))

Every random number comes from the `generator` passed in (the global RNG of the images' device when it is None),
a fixed number of draws per call whatever the data, so the trainer's RNG state in a checkpoint makes the views
bit-identical after a resume on CPU. The semantics follow torchvision's transforms (RandomResizedCrop,
RandomHorizontalFlip, ColorJitter with a random order of its four operations per sample, RandomGrayscale,
GaussianBlur, RandomSolarize). Two paths with the same draws:
- on an accelerator, every operation runs on the whole batch and torch.where keeps it per sample (no host
  synchronisation); crops are continuous boxes resampled by one grid_sample (no antialiasing, so keep the stored
  or worker-resized images close to the output size);
- on the CPU, cache-sized chunks, each operation only on the samples that drew it; outputs above 64x64 are
  cropped with whole-pixel boxes resized with antialiasing in uint8, as torchvision does (`tools/bench_loader.py`:
  1.8x the per-core throughput of webdataset + per-image torchvision v2 at 96 and 224 px).

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

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from kornia.filters import gaussian_blur2d
from torch import nn

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize default, as in VICReg


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
        size = self.image_size or tuple(images.shape[-2:])
        draws = _draw(recipe, _Sampler(generator, images.device, images.shape[0]), images.shape, size, sizes)
        if host_reads_are_free(images.device) and not (recipe.crop_scale is None and sizes is None):
            return self._view_per_image(images, recipe, draws, size, sizes)
        x = images.float().div_(255)
        x = _resample(x, recipe, draws, size, sizes)
        return self._normalize(_colour_blur_solarize(x, recipe, draws, _where))

    def _view_per_image(self, images, recipe: ViewRecipe, draws: "_Draws", size, sizes) -> torch.Tensor:
        """The CPU path: per-sample operations on cache-sized chunks, each computed only for the samples that drew
        it. Outputs above 64x64 are cropped with whole-pixel boxes resized with antialiasing in uint8 (as
        torchvision does, ~10x faster than resampling); smaller ones keep the continuous boxes of the batched
        path (whole pixels would leave an 8x8 digit a handful of distinct crops)."""
        B, C = images.shape[:2]
        out = torch.empty(B, C, *size, dtype=torch.float32)
        chunk = max(1, _CHUNK_BYTES // (4 * C * size[0] * size[1]))
        small = size[0] * size[1] <= _SMALL_OUTPUT
        if small:
            resampled = _resample(images.float().div_(255), recipe, draws, size, sizes)
        host = draws.to_host()
        for start in range(0, B, chunk):
            stop = min(start + chunk, B)
            rows = host.rows(start, stop)
            if small:
                x = resampled[start:stop]
            else:
                crops = [_crop_one(images[start + i], region, box, flip, size, recipe)
                         for i, (region, box, flip) in enumerate(zip(rows.region, rows.boxes, rows.flip))]
                x = torch.stack(crops).float().div_(255)
            out[start:stop] = self._normalize(_colour_blur_solarize(x, recipe, rows, _select))
        return out

    def _normalize(self, x):
        return (x - self.mean) / self.std


_CHUNK_BYTES = 1 << 20  # float32 images per chunk on the CPU: the working set stays in the L2 cache
_SMALL_OUTPUT = 64 * 64  # CPU outputs up to this many pixels keep continuous crop boxes


def host_reads_are_free(device: torch.device) -> bool:
    """On the CPU, reading random draws back to Python costs nothing, so each operation runs only on the samples
    that drew it; on an accelerator every operation runs on the whole batch and `torch.where` picks per sample,
    so augmentation never waits for the device. (A test forces the accelerator path on the CPU.)"""
    return device.type == "cpu"


@dataclass
class _Draws:
    """One view's random parameters for a batch, drawn in a fixed order (the generator advances alike whatever
    the data). Boxes are (x0, y0, w, h) in pixels inside each image's valid (height, width) `region`."""
    region: torch.Tensor
    boxes: torch.Tensor
    flip: torch.Tensor
    jitter: tuple | None = None  # factors (4, B), order (B, 4), apply (B,)
    gray: torch.Tensor | None = None
    blur: tuple | None = None  # sigma (B,), apply (B,)
    solarize: torch.Tensor | None = None

    def to_host(self) -> "_Draws":
        """The per-sample choices as Python lists (factors and sigmas stay tensors)."""
        j, b = self.jitter, self.blur
        return _Draws(self.region.tolist(), self.boxes.tolist(), self.flip.tolist(),
                      j and (j[0], j[1].tolist(), j[2].tolist()), _list(self.gray), b and (b[0], b[1].tolist()),
                      _list(self.solarize))

    def rows(self, start: int, stop: int) -> "_Draws":
        """The samples start..stop of host draws."""
        cut, j, b = slice(start, stop), self.jitter, self.blur
        return _Draws(self.region[cut], self.boxes[cut], self.flip[cut], j and (j[0][:, cut], j[1][cut], j[2][cut]),
                      self.gray and self.gray[cut], b and (b[0][cut], b[1][cut]), self.solarize and self.solarize[cut])


def _list(mask: torch.Tensor | None) -> list | None:
    return None if mask is None else mask.tolist()


class _Sampler:
    """Per-sample random numbers from one generator, on the generator's device, moved to the data's."""

    def __init__(self, generator: torch.Generator | None, device: torch.device, batch: int):
        self.generator, self.device, self.batch = generator, device, batch
        self.source = generator.device if generator is not None else device

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        u = torch.rand((self.batch, *shape), generator=self.generator, device=self.source)
        return (lo + (hi - lo) * u).to(self.device, non_blocking=True)  # usually already there

    def bernoulli(self, p: float) -> torch.Tensor:
        return self.uniform(0.0, 1.0) < p


def _draw(recipe: ViewRecipe, rand: _Sampler, shape, size, sizes: torch.Tensor | None) -> _Draws:
    """Every random parameter of one view, in the order: crop, flip, jitter, grayscale, blur, solarization."""
    B = shape[0]
    if sizes is None:
        H = torch.full((B,), float(shape[2]), device=rand.device)
        W = torch.full((B,), float(shape[3]), device=rand.device)
    else:
        sizes = sizes.to(rand.device, torch.float32, non_blocking=True)  # no wait for the device's queue
        H, W = sizes[:, 0], sizes[:, 1]
    boxes, flip = _crop_boxes(recipe, rand, H, W, size)
    draws = _Draws(torch.stack([H, W], 1), boxes, flip)
    if recipe.jitter is not None:
        b, c, s, h = recipe.jitter
        factors = torch.stack([rand.uniform(max(0.0, 1 - b), 1 + b), rand.uniform(max(0.0, 1 - c), 1 + c),
                               rand.uniform(max(0.0, 1 - s), 1 + s), rand.uniform(-h, h)])
        order = torch.argsort(rand.uniform(0.0, 1.0, 4), dim=1)
        draws.jitter = (factors, order, rand.bernoulli(recipe.jitter_p))
    if recipe.gray_p > 0 and shape[1] == 3:
        draws.gray = rand.bernoulli(recipe.gray_p)
    if recipe.blur_p > 0:
        draws.blur = (rand.uniform(*recipe.blur_sigma), rand.bernoulli(recipe.blur_p))
    if recipe.solarize_p > 0:
        draws.solarize = rand.bernoulli(recipe.solarize_p)
    return draws


def _crop_boxes(recipe: ViewRecipe, rand: _Sampler, H: torch.Tensor, W: torch.Tensor, size):
    """RandomResizedCrop's box distribution (ten tries of scale and log-uniform aspect ratio, the first that fits,
    else a central fallback) and the flip; without a crop, the largest centered box of the output's aspect."""
    if recipe.crop_scale is None:
        aspect = size[1] / size[0]
        w = torch.minimum(W, H * aspect)
        h = w / aspect
        return torch.stack([(W - w) / 2, (H - h) / 2, w, h], 1), torch.zeros_like(w, dtype=torch.bool)
    area = (H * W)[:, None] * rand.uniform(*recipe.crop_scale, 10)
    aspect = torch.exp(rand.uniform(math.log(recipe.crop_ratio[0]), math.log(recipe.crop_ratio[1]), 10))
    w, h = torch.sqrt(area * aspect), torch.sqrt(area / aspect)
    fits = (w <= W[:, None]) & (h <= H[:, None])
    first = fits.float().argmax(1, keepdim=True)  # the first try that fits, as torchvision does
    w, h = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0]
    any_fit = fits.any(1)
    w = torch.where(any_fit, w, torch.minimum(W, H * recipe.crop_ratio[1]))
    h = torch.where(any_fit, h, torch.minimum(H, W / recipe.crop_ratio[0]))
    corner = rand.uniform(0.0, 1.0, 2)
    x0 = torch.where(any_fit, corner[:, 0] * (W - w), (W - w) / 2)
    y0 = torch.where(any_fit, corner[:, 1] * (H - h), (H - h) / 2)
    return torch.stack([x0, y0, w, h], 1), rand.bernoulli(recipe.flip_p)


def _crop_one(image: torch.Tensor, region, box, flip: bool, size, recipe: ViewRecipe) -> torch.Tensor:
    """One image's crop box rounded to whole pixels inside its region, resized (antialiased, uint8), mirrored."""
    (H, W), (x0, y0, w, h) = (int(v) for v in region), box
    w, h = min(max(1, round(w)), W), min(max(1, round(h)), H)
    x0, y0 = max(0, min(round(x0), W - w)), max(0, min(round(y0), H - h))
    crop = image[:, y0:y0 + h, x0:x0 + w]
    if (h, w) != tuple(size):
        mode = recipe.interpolation if recipe.crop_scale is not None else "bilinear"
        crop = F.interpolate(crop[None], size=size, mode=mode, antialias=True, align_corners=False)[0]
    return crop.flip(-1) if flip else crop


def _resample(x: torch.Tensor, recipe: ViewRecipe, draws: _Draws, size, sizes) -> torch.Tensor:
    """The batched crop + flip + resize: every box resampled at once by grid_sample (continuous boxes, no
    antialiasing: keep the stored or worker-resized images close to the output size)."""
    B, C, canvas_h, canvas_w = x.shape
    if recipe.crop_scale is None and sizes is None:
        if (canvas_h, canvas_w) == tuple(size):
            return x
        return F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False).clamp_(0, 1)
    x0, y0, w, h = draws.boxes.unbind(1)
    sign = torch.where(draws.flip, -1.0, 1.0)
    theta = torch.zeros(B, 2, 3, device=x.device)
    theta[:, 0, 0] = sign * w / canvas_w  # normalized coordinates: output [-1, 1] -> crop box in the canvas
    theta[:, 0, 2] = (2 * x0 + w) / canvas_w - 1
    theta[:, 1, 1] = h / canvas_h
    theta[:, 1, 2] = (2 * y0 + h) / canvas_h - 1
    grid = F.affine_grid(theta, [B, C, *size], align_corners=False)
    mode = recipe.interpolation if recipe.crop_scale is not None else "bilinear"
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False).clamp_(0, 1)  # bicubic overshoots


def crop_flip_resize(x: torch.Tensor, recipe: ViewRecipe, size: tuple[int, int], rand: _Sampler,
                     sizes: torch.Tensor | None = None) -> torch.Tensor:
    """RandomResizedCrop + horizontal flip of a float batch, batched (the accelerator path)."""
    draws = _draw(ViewRecipe(crop_scale=recipe.crop_scale, crop_ratio=recipe.crop_ratio, flip_p=recipe.flip_p,
                             interpolation=recipe.interpolation), rand, x.shape, size, sizes)
    return _resample(x, recipe, draws, size, sizes)


def _where(x: torch.Tensor, chosen: torch.Tensor, op, *args: torch.Tensor) -> torch.Tensor:
    """Accelerator path: `op` on the whole batch, kept where `chosen` (no data-dependent shapes, no waiting)."""
    return torch.where(chosen.view(-1, 1, 1, 1), op(x, *args), x)


def _select(x: torch.Tensor, chosen: list, op, *args: torch.Tensor) -> torch.Tensor:
    """CPU path: `op` only on the chosen samples."""
    rows = [i for i, c in enumerate(chosen) if c]
    if not rows:
        return x
    if len(rows) == len(chosen):
        return op(x, *args)
    rows_t = torch.tensor(rows)
    x[rows_t] = op(x[rows_t], *(a[rows_t] for a in args))
    return x


def _colour_blur_solarize(x: torch.Tensor, recipe: ViewRecipe, draws, pick) -> torch.Tensor:
    """Colour jitter (its four operations in each sample's own order), grayscale, blur and solarization, each
    applied to the samples that drew it; `pick` is `_where` (batched) or `_select` (CPU)."""
    if draws.jitter is not None:
        factors, order, apply = draws.jitter
        b, c, s, h = recipe.jitter
        active = [b > 0, c > 0, s > 0 and x.shape[1] == 3, h > 0 and x.shape[1] == 3]
        if pick is _where:
            x = _jitter_folded(x, factors, order, apply, active)
        else:
            for step in range(4):
                for op in range(4):
                    if active[op]:
                        chosen = _chosen(pick, apply, order, step, op)
                        x = pick(x, chosen, _COLOUR_OPS[op], _column(factors[op]))
    if draws.gray is not None:
        x = pick(x, draws.gray, lambda y: gray(y).expand_as(y).contiguous())
    if draws.blur is not None:
        sigma, apply = draws.blur
        radius = min(math.ceil(3 * recipe.blur_sigma[1]), min(x.shape[-2:]) - 1)  # 3 sigma, within reflect padding
        x = pick(x, apply, lambda y, s: gaussian_blur2d(y, 2 * radius + 1, s.view(-1, 1).expand(-1, 2).contiguous()),
                 sigma)
    if draws.solarize is not None:
        x = pick(x, draws.solarize, lambda y: torch.where(y >= SOLARIZE_THRESHOLD, 1 - y, y))
    return x


def _jitter_folded(x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor, apply: torch.Tensor,
                   active: list[bool]) -> torch.Tensor:
    """The accelerator path's colour jitter: at each of the four positions of the samples' orders, brightness,
    contrast and saturation are one blend ``f*x + (1-f)*target`` (target 0, the mean gray or the gray image; f = 1
    where a sample does none of them), then hue where chosen: 4 whole-batch blends instead of 12 evaluations and
    `where`s, with results equal to applying each operation with `_where` (tests/train/test_gpu_paths.py keeps that as
    the reference)."""
    for step in range(4):
        op = order[:, step]
        does = [apply & (op == i) if active[i] else None for i in range(4)]
        if any(active[:3]):
            blend = functools.reduce(torch.logical_or, [d for d in does[:3] if d is not None])
            f = _column(torch.where(blend, factors.gather(0, op[None])[0], 1.0))
            target = torch.zeros((), device=x.device)  # brightness
            if active[1] or active[2]:
                g = gray(x)
                if active[1]:
                    target = torch.where(_column(does[1]), g.mean(dim=(1, 2, 3), keepdim=True), target)
                if active[2]:
                    target = torch.where(_column(does[2]), g, target)
            x = (f * x + (1 - f) * target).clamp_(0, 1)
        if active[3]:
            x = _where(x, does[3], _hue, _column(factors[3]))
    return x


def _chosen(pick, apply, order, step: int, op: int) -> list[bool]:
    """CPU path: the samples doing operation `op` at position `step` of their order."""
    return [a and o[step] == op for a, o in zip(apply, order)]


def _column(values: torch.Tensor) -> torch.Tensor:
    return values.view(-1, 1, 1, 1)


def gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (GRAY_WEIGHTS[0] * r + GRAY_WEIGHTS[1] * g + GRAY_WEIGHTS[2] * b).unsqueeze(1)


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
    delta = maxc - x.amin(dim=1, keepdim=True)  # = value * saturation; where 0 every channel equals maxc
    r, g, b = x.split(1, dim=1)
    rise = torch.where(argmax == 0, g - b, torch.where(argmax == 1, b - r, r - g))
    hue = torch.remainder(rise.div_(delta.clamp_min(1e-12)).add_(argmax.mul(2)).add_(6 * f), 6)  # sextant 0..6
    # HSV -> RGB without branches: channel n in (r, g, b) = v - v*s*clamp(2 - |k - 2|, 0, 1), k = (n' + h) mod 6
    k = torch.remainder(torch.cat([hue + 5.0, hue + 3.0, hue + 1.0], dim=1), 6)  # Python offsets: no host copy
    return k.sub_(2).abs_().neg_().add_(2).clamp_(0, 1).mul_(delta).neg_().add_(maxc).clamp_(0, 1)


_COLOUR_OPS = (_brightness, _contrast, _saturation, _hue)
