"""The accelerator path of one augmented view as a pure function of (uint8 images, the view's random block), so that
it compiles into one graph (`torch.compile(fullgraph=True)`: a few fused kernels instead of ~400 launches per view,
each colour operation blended in where a sample drew it without a pass of its own over memory).

The random block (B, `Sampler.BLOCK`) is drawn outside, from the trainer's generator, so a compiled and an eager
step draw the same numbers and resume stays exact."""

from __future__ import annotations

import functools

import torch

from eigtrain.data.augment_draws import Sampler, draw
from eigtrain.data.augment_fusable import gaussian_blur_shifted, resample_separable
from eigtrain.data.augment_ops import colour_blur_solarize, gaussian_blur, resample, where
from eigtrain.data.augment_recipes import ViewRecipe


def batched_view(
    images: torch.Tensor,
    block: torch.Tensor,
    sizes: torch.Tensor | None,
    mean: torch.Tensor,
    std: torch.Tensor,
    *,
    recipe: ViewRecipe,
    size: tuple[int, int],
    dtype: torch.dtype,
    channels_last: bool,
    fusable: bool = False,
) -> torch.Tensor:
    """One view of a uint8 batch: crop + flip + resize (one grid_sample), colour, blur, solarization, normalization,
    in `dtype` and (if asked) channels_last; every random parameter a function of `block`. fusable: the crop and
    the blur in the forms Inductor fuses (`augment_fusable`: equal up to float rounding), for the compiled view."""
    draws = draw(recipe, Sampler.from_block(block), images.shape, size, sizes)
    if fusable and not (recipe.crop_scale is None and sizes is None):
        mode = recipe.interpolation if recipe.crop_scale is not None else "bilinear"
        x = resample_separable(images, draws.boxes, draws.flip, size, mode).clamp_(0, 1)  # bicubic overshoots
    else:
        x = resample(images.float().div(255), recipe, draws, size, sizes)
    blur = gaussian_blur_shifted if fusable else gaussian_blur
    x = ((colour_blur_solarize(x, recipe, draws, where, blur) - mean) / std).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@functools.lru_cache(maxsize=None)
def compiled_view(
    recipe: ViewRecipe, size: tuple[int, int], dtype: torch.dtype, channels_last: bool, fusable: bool = True
):
    """`batched_view` for one recipe and output, compiled once per process (static shapes: a batch of another size,
    such as a ragged last one, recompiles once); fusable=False (grid_sample and the convolutions) only to measure."""
    view = functools.partial(
        batched_view, recipe=recipe, size=size, dtype=dtype, channels_last=channels_last, fusable=fusable
    )
    return torch.compile(view, fullgraph=True, dynamic=False)
