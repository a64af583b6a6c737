"""Any embedding model as the encoder of a Rayleigh-Ritz pass: `timm:NAME` or `module:pkg.mod:factory`.

timm models are built with pretrained=False and num_classes=0 (pooled features, no classifier); weights come
only from a local file (`encoder.checkpoint=PATH`, .safetensors or a torch state dict, loaded weights-only),
never from the network. A factory is any importable callable returning an nn.Module; `encoder.kwargs` go to
it (or to timm.create_model). The model must map a (batch, C, H, W) float batch to (batch, d).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import cast

import torch
from torch import nn

KINDS = ("timm", "module")


class EncoderSpecError(ValueError):
    """A model that cannot serve as an embedding encoder: names the cause."""


def build_external_encoder(
    spec: str, checkpoint: str | None = None, kwargs: dict | None = None, in_chans: int = 3, seed: int = 0
) -> nn.Module:
    """The model named by `spec`, in eval mode, with the checkpoint's weights when one is given. Random
    initialization draws from a generator seeded with `seed`, so every rank builds the same model."""
    with torch.random.fork_rng(devices=[]):  # leaves the caller's RNG as it was
        torch.manual_seed(seed)
        return _build(spec, checkpoint, kwargs, in_chans)


def _build(spec: str, checkpoint: str | None, kwargs: dict | None, in_chans: int) -> nn.Module:
    kind, _, target = spec.partition(":")
    kwargs = dict(kwargs or {})
    if kind == "timm" and target:
        import timm

        from eigtrain.models.backbones import refuse_hub_name

        try:
            refuse_hub_name(target)  # eigtrain never downloads: not even a hub model's configuration
        except ValueError as error:
            raise EncoderSpecError(f"encoder={spec}: {str(error).partition(': ')[2]}") from None
        try:
            model = timm.create_model(target, pretrained=False, num_classes=0, **{"in_chans": in_chans, **kwargs})
        except (RuntimeError, TypeError) as error:  # timm's "Unknown model (...)", or kwargs the model does not take
            raise EncoderSpecError(f"encoder={spec}: {_first_line(error)}") from None
        if checkpoint:
            _load_weights(model, checkpoint, spec, droppable=_classifier_prefixes(model))
    elif kind == "module" and target.count(":") == 1:
        module_name, factory_name = target.split(":")
        try:
            factory = getattr(importlib.import_module(module_name), factory_name)
        except (ImportError, AttributeError) as error:
            raise EncoderSpecError(
                f"encoder={spec}: cannot import {factory_name!r} from {module_name!r}: {error}"
            ) from None
        try:
            model = factory(**kwargs)
        except TypeError as error:
            raise EncoderSpecError(
                f"encoder={spec}: the factory does not take encoder.kwargs {kwargs}: {_first_line(error)}"
            ) from None
        if not isinstance(model, nn.Module):
            raise EncoderSpecError(
                f"encoder={spec}: the factory returned {type(model).__name__}, not a torch.nn.Module"
            )
        if checkpoint:
            _load_weights(model, checkpoint, spec, droppable=())
    else:
        raise EncoderSpecError(
            f"encoder={spec!r} is not understood; use timm:NAME (e.g. timm:resnet50) or module:package.module:factory"
        )
    return model.eval()


def _classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Keys of the classifier a pretrained timm checkpoint carries but a num_classes=0 model lacks."""
    names = cast(dict, model.pretrained_cfg).get("classifier") or ()  # timm's config of the model, a dict
    return tuple(f"{n}." for n in ([names] if isinstance(names, str) else names))


def _load_weights(model: nn.Module, path: str, spec: str, droppable: tuple[str, ...]) -> None:
    from timm.models import load_state_dict  # .safetensors or torch.load(weights_only=True); unwraps "state_dict"

    if not Path(path).is_file():
        raise FileNotFoundError(f"encoder.checkpoint={path} does not exist")
    state = load_state_dict(path, use_ema=False, weights_only=True)  # never unpickles code
    state = {k: v for k, v in state.items() if not k.startswith(droppable)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise EncoderSpecError(
            f"encoder.checkpoint={path} does not fit encoder={spec}: "
            f"{len(missing)} missing key(s) {missing[:3]}, {len(unexpected)} unexpected key(s) {unexpected[:3]}"
        )


def check_embedding(z, spec: str, batch: int) -> torch.Tensor:
    """The model's output as a (batch, d) tensor, or one clear error."""
    if not isinstance(z, torch.Tensor):
        raise EncoderSpecError(
            f"encoder={spec} returned {type(z).__name__}; it must return one tensor of shape (batch, d)"
        )
    if z.ndim != 2 or z.shape[0] != batch:
        hint = (
            " (a feature map: add global pooling, e.g. timm's num_classes=0 with global_pool='avg')"
            if z.ndim == 4
            else ""
        )
        raise EncoderSpecError(
            f"encoder={spec} returned shape {tuple(z.shape)} for a batch of {batch}; it must return (batch, d){hint}"
        )
    return z


@torch.no_grad()
def embedding_dim(model: nn.Module, spec: str, input_shape: tuple[int, int, int], device) -> int:
    """d, from one forward pass on a zero batch: checks the output's shape before any data is read."""
    try:
        z = model(torch.zeros(2, *input_shape, device=device))
    except (RuntimeError, ValueError, TypeError, AssertionError) as error:
        raise EncoderSpecError(
            f"encoder={spec} fails on a batch of shape {(2, *input_shape)} (data.view_size / "
            f"data.image_size, encoder.kwargs): {_first_line(error)}"
        ) from None
    return check_embedding(z, spec, 2).shape[1]


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
