"""The random parameters of one augmented view (crop box, flip, jitter factors and order, grayscale, blur,
solarization), drawn per sample from one generator in a fixed order, so that the generator advances alike
whatever the data and a resumed run draws the same views."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from eigtrain.data.augment_recipes import ViewRecipe

Rows = TypeVar("Rows", torch.Tensor, list)  # per-sample values: tensors as drawn, Python lists on the host


@dataclass
class Draws(Generic[Rows]):
    """One view's random parameters for a batch, drawn in a fixed order (the generator advances alike whatever
    the data). Boxes are (x0, y0, w, h) in pixels inside each image's valid (height, width) `region`."""

    region: Rows
    boxes: Rows
    flip: Rows
    jitter: tuple | None = None  # factors (4, B), order (B, 4), apply (B,)
    gray: Rows | None = None
    blur: tuple | None = None  # sigma (B,), apply (B,)
    solarize: Rows | None = None

    def to_host(self: "Draws[torch.Tensor]") -> "Draws[list]":
        """The per-sample choices as Python lists (factors and sigmas stay tensors)."""
        j, b = self.jitter, self.blur
        return Draws(
            self.region.tolist(),
            self.boxes.tolist(),
            self.flip.tolist(),
            j and (j[0], j[1].tolist(), j[2].tolist()),
            _list(self.gray),
            b and (b[0], b[1].tolist()),
            _list(self.solarize),
        )

    def rows(self, start: int, stop: int) -> "Draws[Rows]":
        """The samples start..stop of host draws."""
        cut, j, b = slice(start, stop), self.jitter, self.blur
        return Draws(
            self.region[cut],
            self.boxes[cut],
            self.flip[cut],
            j and (j[0][:, cut], j[1][cut], j[2][cut]),
            self.gray and self.gray[cut],
            b and (b[0][cut], b[1][cut]),
            self.solarize and self.solarize[cut],
        )


def _list(mask: torch.Tensor | None) -> list | None:
    return None if mask is None else mask.tolist()


Generators = torch.Generator | list[torch.Generator] | None  # one for the batch, or one per sample


class Sampler:
    """Per-sample random numbers, on the data's device, taken in order from one block of `BLOCK` uniform numbers per
    sample: drawn at once from one generator for the whole batch (a (B, BLOCK) tensor: one call per view, whatever
    the recipe), or from one CPU generator per sample (a list: then each sample's draws depend on its own generator
    only, not on the batch it came in: eigtrain-rr's views, `eigtrain.export.embed.sample_generators`), or given
    (`from_block`: the compiled augmentation takes the block as an input)."""

    BLOCK = 64  # per-sample numbers of one view (a view uses at most 36)

    def __init__(self, generator: Generators, device: torch.device, batch: int):
        self.generator, self.device, self.batch = generator, device, batch
        if isinstance(generator, list) and len(generator) != batch:
            raise ValueError(f"{len(generator)} per-sample generators for a batch of {batch}")
        self.source = generator.device if isinstance(generator, torch.Generator) else device
        self.block: torch.Tensor | None = None
        self.used = 0

    @classmethod
    def from_block(cls, block: torch.Tensor) -> "Sampler":
        sampler = cls(None, block.device, block.shape[0])
        sampler.block = block
        return sampler

    def random_block(self) -> torch.Tensor:
        """The view's (B, BLOCK) uniform numbers on the data's device: drawn on first use, then the same."""
        if self.block is None:
            if isinstance(self.generator, list):
                block = torch.stack([torch.rand(self.BLOCK, generator=g) for g in self.generator])
            else:
                block = torch.rand((self.batch, self.BLOCK), generator=self.generator, device=self.source)
            self.block = block.to(self.device, non_blocking=True)  # usually already there
        return self.block

    def uniform(self, lo: float, hi: float, *shape: int) -> torch.Tensor:
        count = math.prod(shape)
        if self.used + count > self.BLOCK:
            raise RuntimeError(f"a view draws more than {self.BLOCK} numbers per sample")
        u = self.random_block()[:, self.used : self.used + count].reshape(self.batch, *shape)
        self.used += count
        return lo + (hi - lo) * u

    def bernoulli(self, p: float) -> torch.Tensor:
        return self.uniform(0.0, 1.0) < p


def draw(recipe: ViewRecipe, rand: Sampler, shape, size, sizes: torch.Tensor | None) -> Draws[torch.Tensor]:
    """Every random parameter of one view, in the order: crop, flip, jitter, grayscale, blur, solarization."""
    B = shape[0]
    if sizes is None:
        H = torch.full((B,), float(shape[2]), device=rand.device)
        W = torch.full((B,), float(shape[3]), device=rand.device)
    else:
        sizes = sizes.to(rand.device, torch.float32, non_blocking=True)  # no wait for the device's queue
        H, W = sizes[:, 0], sizes[:, 1]
    boxes, flip = _crop_boxes(recipe, rand, H, W, size)
    draws = Draws(torch.stack([H, W], 1), boxes, flip)
    if recipe.jitter is not None:
        b, c, s, h = recipe.jitter
        factors = torch.stack(
            [
                rand.uniform(max(0.0, 1 - b), 1 + b),
                rand.uniform(max(0.0, 1 - c), 1 + c),
                rand.uniform(max(0.0, 1 - s), 1 + s),
                rand.uniform(-h, h),
            ]
        )
        order = torch.argsort(rand.uniform(0.0, 1.0, 4), dim=1)
        draws.jitter = (factors, order, rand.bernoulli(recipe.jitter_p))
    if recipe.gray_p > 0 and shape[1] == 3:
        draws.gray = rand.bernoulli(recipe.gray_p)
    if recipe.blur_p > 0:
        draws.blur = (rand.uniform(*recipe.blur_sigma), rand.bernoulli(recipe.blur_p))
    if recipe.solarize_p > 0:
        draws.solarize = rand.bernoulli(recipe.solarize_p)
    return draws


def _crop_boxes(recipe: ViewRecipe, rand: Sampler, H: torch.Tensor, W: torch.Tensor, size):
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
