"""The operations of an augmented view, for both paths: crops (one image at a time on the CPU, all boxes by one
grid_sample on an accelerator), colour jitter, grayscale, blur and solarization applied per sample with `where`
(whole batch, no host synchronisation) or `select` (only the samples that drew it)."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from eigtrain.data.augment_draws import Draws, Sampler, draw
from eigtrain.data.augment_recipes import ViewRecipe

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize default, as in VICReg


def crop_one(image: torch.Tensor, region, box, flip: bool, size, recipe: ViewRecipe) -> torch.Tensor:
    """One image's crop box rounded to whole pixels inside its region, resized (antialiased, uint8), mirrored."""
    (H, W), (x0, y0, w, h) = (int(v) for v in region), box
    w, h = min(max(1, round(w)), W), min(max(1, round(h)), H)
    x0, y0 = max(0, min(round(x0), W - w)), max(0, min(round(y0), H - h))
    crop = image[:, y0 : y0 + h, x0 : x0 + w]
    if (h, w) != tuple(size):
        mode = recipe.interpolation if recipe.crop_scale is not None else "bilinear"
        crop = F.interpolate(crop[None], size=size, mode=mode, antialias=True, align_corners=False)[0]
    return crop.flip(-1) if flip else crop


def resample(x: torch.Tensor, recipe: ViewRecipe, draws: Draws[torch.Tensor], size, sizes) -> torch.Tensor:
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
    # clamped: bicubic overshoots
    return F.grid_sample(x, grid, mode=mode, padding_mode="border", align_corners=False).clamp_(0, 1)


def crop_flip_resize(
    x: torch.Tensor, recipe: ViewRecipe, size: tuple[int, int], rand: Sampler, sizes: torch.Tensor | None = None
) -> torch.Tensor:
    """RandomResizedCrop + horizontal flip of a float batch, batched (the accelerator path)."""
    draws = draw(
        ViewRecipe(
            crop_scale=recipe.crop_scale,
            crop_ratio=recipe.crop_ratio,
            flip_p=recipe.flip_p,
            interpolation=recipe.interpolation,
        ),
        rand,
        x.shape,
        size,
        sizes,
    )
    return resample(x, recipe, draws, size, sizes)


def where(x: torch.Tensor, chosen: torch.Tensor, op, *args: torch.Tensor) -> torch.Tensor:
    """Accelerator path: `op` on the whole batch, kept where `chosen` (no data-dependent shapes, no waiting)."""
    return torch.where(chosen.view(-1, 1, 1, 1), op(x, *args), x)


def select(x: torch.Tensor, chosen: list, op, *args: torch.Tensor) -> torch.Tensor:
    """CPU path: `op` only on the chosen samples."""
    rows = [i for i, c in enumerate(chosen) if c]
    if not rows:
        return x
    if len(rows) == len(chosen):
        return op(x, *args)
    rows_t = torch.tensor(rows)
    x[rows_t] = op(x[rows_t], *(a[rows_t] for a in args))
    return x


def colour_blur_solarize(x: torch.Tensor, recipe: ViewRecipe, draws, pick, blur=None) -> torch.Tensor:
    """Colour jitter (its four operations in each sample's own order), grayscale, blur and solarization, each
    applied to the samples that drew it; `pick` is `where` (batched) or `select` (CPU); `blur` is `gaussian_blur`
    unless given (the compiled view's fusable form)."""
    if draws.jitter is not None:
        factors, order, apply = draws.jitter
        assert recipe.jitter is not None  # `draw` draws jitter only for a recipe with jitter
        b, c, s, h = recipe.jitter
        active = [b > 0, c > 0, s > 0 and x.shape[1] == 3, h > 0 and x.shape[1] == 3]
        if pick is where:
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
        blur = blur or gaussian_blur
        x = pick(x, apply, lambda y, s: blur(y, s, radius), sigma)
    if draws.solarize is not None:
        x = pick(x, draws.solarize, lambda y: torch.where(y >= SOLARIZE_THRESHOLD, 1 - y, y))
    return x


def blur_weights(sigma: torch.Tensor, radius: int, like: torch.Tensor) -> torch.Tensor:
    """Each sample's (2 radius + 1) Gaussian taps (B, taps), normalized to sum 1, in `like`'s dtype and device."""
    taps = torch.arange(-radius, radius + 1, device=like.device, dtype=like.dtype)
    weights = torch.exp(-(taps**2) / (2 * sigma.to(like.dtype).view(-1, 1) ** 2))
    return weights / weights.sum(1, keepdim=True)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """Gaussian blur with each sample's own sigma (B,), a (2 radius + 1)-tap separable kernel normalized to sum 1,
    reflect padding: kornia's gaussian_blur2d (which it replaces: it synchronised with the host twice a call), as
    two depthwise convolutions whose weights are computed on the device."""
    B, C, H, W = x.shape
    weights = blur_weights(sigma, radius, x).repeat_interleave(C, 0)  # (B * C, taps)
    padded = F.pad(x, (radius, radius, radius, radius), mode="reflect").reshape(1, B * C, H + 2 * radius, -1)
    rows = F.conv2d(padded, weights.view(B * C, 1, 1, -1), groups=B * C)
    return F.conv2d(rows, weights.view(B * C, 1, -1, 1), groups=B * C).view(B, C, H, W)


def _jitter_folded(
    x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor, apply: torch.Tensor, active: list[bool]
) -> torch.Tensor:
    """The accelerator path's colour jitter: at each of the four positions of the samples' orders, brightness,
    contrast and saturation are one blend ``f*x + (1-f)*target`` (target 0, the mean gray or the gray image; f = 1
    where a sample does none of them), then hue where chosen: 4 whole-batch blends instead of 12 evaluations and
    `where`s, with results equal to applying each operation with `where` (tests/train/test_gpu_paths.py keeps that as
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
                    assert does[1] is not None  # does[i] is a mask wherever active[i]
                    target = torch.where(_column(does[1]), g.mean(dim=(1, 2, 3), keepdim=True), target)
                if active[2]:
                    assert does[2] is not None
                    target = torch.where(_column(does[2]), g, target)
            x = (f * x + (1 - f) * target).clamp_(0, 1)
        if active[3]:
            assert does[3] is not None
            x = where(x, does[3], _hue, _column(factors[3]))
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
    # channel offsets 5, 3, 1 made on the device (no host copy) and broadcast: a cat would be a buffer of its own
    k = torch.remainder(hue + torch.arange(5, 0, -2, device=x.device, dtype=x.dtype).view(1, 3, 1, 1), 6)
    return k.sub_(2).abs_().neg_().add_(2).clamp_(0, 1).mul_(delta).neg_().add_(maxc).clamp_(0, 1)


_COLOUR_OPS = (_brightness, _contrast, _saturation, _hue)
