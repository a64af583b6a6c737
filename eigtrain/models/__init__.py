"""Encoders: timm backbones (ResNet with optional CIFAR stem, ViT), a tiny CNN, an MLP, projector heads."""

from eigtrain.models.backbones import BACKBONES, IMAGE_BACKBONES, VECTOR_BACKBONES, build_backbone
from eigtrain.models.encoder import (
    Encoder,
    PairEncoder,
    Projector,
    build_encoder,
    convert_sync_batch_norm,
    use_sync_batch_norm,
)

__all__ = [
    "BACKBONES",
    "IMAGE_BACKBONES",
    "VECTOR_BACKBONES",
    "build_backbone",
    "Encoder",
    "PairEncoder",
    "Projector",
    "build_encoder",
    "convert_sync_batch_norm",
    "use_sync_batch_norm",
]
