"""The compiled accelerator path's forms of the crop resampling and the blur: the same results as grid_sample and the
grouped convolutions of `augment_ops` up to float rounding, written as indexed reads and shifted slices that
Inductor fuses into the view's pointwise kernels.

Why (issue 37, ResNet-50 224 px b256 on an H200: the compiled augmentation took 11.3 ms of an 83.5 ms step):
- Inductor decomposes grid_sample into per-pixel coordinate arithmetic computed for every channel; its lowering
  materializes about ten full-size float buffers per view for the bicubic coordinates (seen in its CPU code at
  64 px). A crop box is axis-aligned, so the 4 x 4 bicubic (2 x 2 bilinear) taps separate: per-sample tables of
  W' columns and H' rows (indices and weights, a few KB), then reads of the uint8 images at those taps.
- a grouped convolution (groups = B * C, one kernel per sample) is an extern kernel that Inductor does not fuse:
  two full fp32 passes plus the reflect-padded copy. As 2 x (2 r + 1) shifted slices times per-sample weights it
  is pointwise and fuses with the padding before it and the solarization and normalization after it.
Eager, these forms would be dozens of whole-batch kernels: the eager accelerator path keeps grid_sample and the
convolutions (`batched_view(fusable=False)`), bit for bit as before."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from eigtrain.data.augment_ops import blur_weights

CUBIC_A = -0.75  # grid_sample's (and PIL's) bicubic convolution constant


def resample_separable(images: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size, mode: str) -> torch.Tensor:
    """grid_sample(images / 255, affine_grid(crop boxes, flipped), mode, padding_mode="border",
    align_corners=False) of a uint8 batch, from per-axis taps (a crop box is axis-aligned): float32, unclamped."""
    B, C, canvas_h, canvas_w = images.shape  # boxes inside each sample's region of the (padded) canvas
    x0, y0, w, h = boxes.unbind(1)
    sign = torch.where(flip, -1.0, 1.0)
    cols, col_w = _taps(sign * w / canvas_w, (2 * x0 + w) / canvas_w - 1, size[1], canvas_w, mode)  # (B, W', T)
    rows, row_w = _taps(h / canvas_h, (2 * y0 + h) / canvas_h - 1, size[0], canvas_h, mode)  # (B, H', T)
    # every tap read straight from the uint8 images by small broadcast indices (B, 1, 1), (B, H', 1), (B, 1, W'):
    # one pointwise kernel, nothing in between; summed as grid_sample does, along each row, then across the rows;
    # laid out as the images (NCHW), as grid_sample returns it
    pixels, sample = images.permute(0, 2, 3, 1), torch.arange(B, device=images.device)[:, None, None]

    def tap(i: int, j: int) -> torch.Tensor:
        at = pixels[sample, rows[:, :, None, i], cols[:, None, :, j]].permute(0, 3, 1, 2)  # (B, C, H', W')
        return at.float().div(255) * col_w[:, None, None, :, j]

    taps = range(cols.shape[-1])
    return _sum([_sum([tap(i, j) for j in taps]) * row_w[:, None, :, None, i] for i in taps]).contiguous()


def _taps(scale: torch.Tensor, shift: torch.Tensor, n_out: int, n_in: int, mode: str):
    """For each sample (B,) and output position: the input indices (clamped to the border) and weights of its taps,
    from the normalized grid coordinate scale * base + shift, as affine_grid and grid_sample compute it."""
    base = torch.linspace(-1, 1, n_out, device=scale.device) * ((n_out - 1) / n_out)  # affine_grid, align_corners=F
    coord = scale[:, None] * base + shift[:, None]
    pos = ((coord + 1) * n_in - 1) / 2  # grid_sampler_unnormalize
    if mode == "bilinear":
        pos = pos.clamp(0, n_in - 1)  # border padding clips the coordinate before the taps
        first = pos.floor()
        t = pos - first
        weights = torch.stack([1 - t, t], -1)
        offsets = torch.arange(0, 2, device=scale.device)
    elif mode == "bicubic":
        first = pos.floor()
        t = pos - first
        a = CUBIC_A
        near, far = t, 1 - t  # get_cubic_upsample_coefficients
        weights = torch.stack(
            [
                ((a * (near + 1) - 5 * a) * (near + 1) + 8 * a) * (near + 1) - 4 * a,
                ((a + 2) * near - (a + 3)) * near * near + 1,
                ((a + 2) * far - (a + 3)) * far * far + 1,
                ((a * (far + 1) - 5 * a) * (far + 1) + 8 * a) * (far + 1) - 4 * a,
            ],
            -1,
        )
        offsets = torch.arange(-1, 3, device=scale.device)
    else:
        raise ValueError(f"the batched crop resamples bilinear or bicubic, not {mode!r}")
    index = (first.long()[..., None] + offsets).clamp(0, n_in - 1)  # border: each tap clamped to the image
    return index, weights


def gaussian_blur_shifted(x: torch.Tensor, sigma: torch.Tensor, radius: int) -> torch.Tensor:
    """`augment_ops.gaussian_blur` (per-sample sigma (B,), 2 radius + 1 taps normalized to sum 1, reflect padding)
    as sums of shifted slices times per-sample weights: pointwise, so the compiled view fuses it."""
    H, W = x.shape[-2:]
    weights = blur_weights(sigma, radius, x).view(-1, 1, 1, 1, 2 * radius + 1)
    padded = F.pad(x, (radius, radius, radius, radius), mode="reflect")
    rows = _sum([weights[..., t] * padded[..., t : t + W] for t in range(2 * radius + 1)])
    return _sum([weights[..., t] * rows[..., t : t + H, :] for t in range(2 * radius + 1)])


def _sum(terms: list[torch.Tensor]) -> torch.Tensor:
    """Left to right, from the first term (no added zero)."""
    return functools.reduce(torch.add, terms)
