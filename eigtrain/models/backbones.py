"""Backbones: timm ResNets and ViTs for images, a tiny CNN for CPU runs, an MLP for vectors.

Every builder returns a module mapping a batch to (batch, num_features) and exposing
``num_features``; the projector head is added by ``eigtrain.models.encoder``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from eigtrain.schema import ModelConfig

IMAGE_BACKBONES = ("tiny_cnn", "resnet18", "resnet50", "vit_tiny", "vit_small", "vit_base")
VECTOR_BACKBONES = ("mlp",)
BACKBONES = IMAGE_BACKBONES + VECTOR_BACKBONES

_TIMM_NAMES = {
    "resnet18": "resnet18",
    "resnet50": "resnet50",
    "vit_tiny": "vit_tiny_patch16_224",
    "vit_small": "vit_small_patch16_224",
    "vit_base": "vit_base_patch16_224",  # ViT-B/16
}
TIMM_PREFIX = "timm:"  # model.backbone=timm:NAME: any timm model, with model.timm_kwargs


class TinyCNN(nn.Module):
    """Three conv blocks and average pooling to a pool x pool grid (1: global): trains in seconds on CPU (digits,
    8x8). A grid keeps where a feature is, which a global pool discards."""

    def __init__(self, in_chans: int, width: int = 32, pool: int = 1):
        super().__init__()

        def block(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]

        self.body = nn.Sequential(
            *block(in_chans, width, 1),
            *block(width, 2 * width, 2),
            *block(2 * width, 2 * width, 1),
            nn.AdaptiveAvgPool2d(pool),
            nn.Flatten(),
        )
        self.num_features = 2 * width * pool * pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class MLP(nn.Module):
    """Fully connected GELU network for vector inputs (synthetic kernels, stored feature pairs)."""

    def __init__(self, in_features: int, width: int = 128, depth: int = 4):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(depth):
            layers += [nn.Linear(in_features if i == 0 else width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.num_features = width if depth > 0 else in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _cifar_stem(resnet: nn.Module, in_chans: int) -> None:
    # Small images (32x32): a 3x3 stride-1 first conv and no max-pool keep the spatial resolution
    # (the usual SimCLR/SimSiam CIFAR variant).
    conv1 = resnet.conv1
    assert isinstance(conv1, nn.Conv2d)  # timm's ResNets have a plain conv stem
    width = conv1.out_channels
    resnet.conv1 = nn.Conv2d(in_chans, width, kernel_size=3, stride=1, padding=1, bias=False)
    resnet.maxpool = nn.Identity()


def build_backbone(config: ModelConfig, input_shape: Sequence[int]) -> nn.Module:
    """Build the backbone of the ``model`` config for inputs of ``input_shape`` ((C, H, W) for images, (n,) for
    vectors)."""
    name, width, depth, patch_size = config.backbone, config.width, config.depth, config.patch_size
    if name.startswith(TIMM_PREFIX):
        return _timm_backbone(name.removeprefix(TIMM_PREFIX), config, input_shape)
    if name not in BACKBONES:
        raise ValueError(f"model.backbone={name!r} is not known; allowed: {', '.join(BACKBONES)}")
    if name in VECTOR_BACKBONES:
        n_in = int(torch.Size(input_shape).numel())
        return MLP(n_in, width=width, depth=depth)
    if len(input_shape) != 3:
        raise ValueError(
            f"model.backbone={name!r} needs image inputs (C, H, W); the data gives shape {tuple(input_shape)}"
        )
    in_chans, height, wide = (int(s) for s in input_shape)
    if name == "tiny_cnn":
        if config.pool < 1:
            raise ValueError(f"model.pool={config.pool} must be at least 1 (the side of the average pool's grid)")
        return TinyCNN(in_chans, width=width, pool=config.pool)
    import timm  # noqa: PLC0415  (slow to import; the tiny CNN and the MLP do not need it)

    if name.startswith("vit"):
        if height % patch_size or wide % patch_size:
            raise ValueError(f"model.patch_size={patch_size} must divide the image size {height}x{wide}")
        kwargs = {
            "in_chans": in_chans,
            "img_size": (height, wide),
            "patch_size": patch_size,
            **(config.timm_kwargs or {}),
        }
        return timm.create_model(_TIMM_NAMES[name], pretrained=False, num_classes=0, **kwargs)
    kwargs = {"in_chans": in_chans, **(config.timm_kwargs or {})}
    resnet = timm.create_model(_TIMM_NAMES[name], pretrained=False, num_classes=0, **kwargs)
    if config.cifar_stem:
        _cifar_stem(resnet, in_chans)
    return resnet


def refuse_hub_name(name: str) -> None:
    """ValueError (one line) for a timm name that points at a model hub or a place (``hf-hub:org/model``,
    ``local-dir:…``): timm would fetch its configuration over the network although no weights are asked for, and
    eigtrain never downloads. Architectures are timm's own names; weights come from model.pretrained."""
    scheme, colon, _ = name.partition(":")
    if colon:
        raise ValueError(
            f"model.backbone=timm:{name} names a model by its location ({scheme}:), which timm fetches over the "
            f"network: eigtrain never downloads; use timm's architecture name (timm:resnet50) and give the weights "
            f"as a local file with model.pretrained=PATH"
        )


def check_timm_backbone(backbone: str) -> None:
    """ValueError (one line) when model.backbone=timm:NAME names no timm model; before any work."""
    import timm  # noqa: PLC0415

    name = backbone.removeprefix(TIMM_PREFIX)
    refuse_hub_name(name)
    if not timm.is_model(name.split(".")[0]):
        raise ValueError(f"model.backbone={backbone}: timm has no model {name!r} (timm.list_models() lists them)")


def _timm_backbone(name: str, cfg: ModelConfig, input_shape: Sequence[int]) -> nn.Module:
    """Any timm model as the backbone (pooled features: num_classes=0), built without weights (model.pretrained
    loads them: eigtrain.models.pretrained). A ViT (timm name vit_*) is built for the data's image size."""
    refuse_hub_name(name)  # every timm model eigtrain builds passes here: a saved config's name too
    import timm  # noqa: PLC0415

    if len(input_shape) != 3:
        raise ValueError(
            f"model.backbone=timm:{name} needs image inputs (C, H, W); the data gives {tuple(input_shape)}"
        )
    kwargs: dict[str, Any] = {"in_chans": int(input_shape[0])}
    if name.startswith("vit"):
        kwargs["img_size"] = tuple(int(s) for s in input_shape[1:])
    kwargs.update(cfg.timm_kwargs or {})
    try:
        return timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    except (RuntimeError, TypeError, AssertionError) as error:  # "Unknown model", an argument the model lacks
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"model.backbone=timm:{name} (model.timm_kwargs={cfg.timm_kwargs}): {first}") from None
