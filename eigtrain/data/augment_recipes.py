"""The augmentation recipes: what one view does (`ViewRecipe`), the presets' two views, and their
normalization constants. The module that applies them is `eigtrain.data.augment`.

Presets (view 1, view 2):
- ``cifar``: crop scale 0.2-1, flip, color jitter 0.4/0.4/0.4/0.1 with p 0.8, grayscale p 0.2; both views alike.
- ``imagenet``: the VICReg recipe: crop scale 0.08-1 (bicubic), flip, jitter 0.4/0.4/0.2/0.1 with p 0.8,
  grayscale p 0.2, Gaussian blur sigma 0.1-2 with p 1.0 / 0.1, solarization p 0.0 / 0.2.
- ``digits``: small crops (scale 0.7-1, aspect 0.8-1.25) of 8x8 digits, i.e. shifts and zooms of about a
  pixel; no flip (digits are not mirror-symmetric), no color.
- ``grayscale``: one-channel images such as Fashion-MNIST's 28x28: crop scale 0.2-1, flip, brightness and
  contrast jitter 0.4/0.4 with p 0.8 (saturation, hue and grayscale mean nothing on one channel).
- ``none``: no augmentation (the two views are equal); resize only if `image_size` differs.
then normalization ``(x / 255 - mean) / std`` with the preset's `NORMALIZATION` unless mean/std are given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
_VICREG = ViewRecipe(crop_scale=(0.08, 1.0), jitter=(0.4, 0.4, 0.2, 0.1), gray_p=0.2, interpolation="bicubic")
_NONE = ViewRecipe(crop_scale=None, flip_p=0.0)

PRESETS: dict[str, tuple[ViewRecipe, ViewRecipe]] = {
    "cifar": (_CIFAR, _CIFAR),
    "imagenet": (replace(_VICREG, blur_p=1.0, solarize_p=0.0), replace(_VICREG, blur_p=0.1, solarize_p=0.2)),
    "digits": (ViewRecipe(crop_scale=(0.7, 1.0), crop_ratio=(0.8, 1.25), flip_p=0.0),) * 2,
    "grayscale": (ViewRecipe(crop_scale=(0.2, 1.0), jitter=(0.4, 0.4, 0.0, 0.0)),) * 2,
    "none": (_NONE, _NONE),
}
NORMALIZATION = {  # (mean, std) per channel
    "cifar": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "digits": ((0.3053,), (0.3759,)),  # measured on scikit-learn's digits scaled to 0..1
    "grayscale": ((0.2860,), (0.3530,)),  # Fashion-MNIST's train split (eigtrain-shards source=idx records its own)
    "none": ((0.5,), (0.5,)),  # broadcast over any number of channels
}
