"""Pretrained backbone weights for training: ``model.pretrained`` = a local file or ``cache``, never a download.

- a path: a .safetensors file or a torch state dict (read weights-only, through timm's reader: a checkpoint's
  ``state_dict`` / ``model`` entry is unwrapped); keys of a timm classifier the num_classes=0 backbone lacks are
  dropped, timm's own checkpoint filter of the architecture (e.g. a ViT's position embedding resampled to the image
  size) is applied, and any other missing or unexpected key is an error.
- ``cache``: the timm backbone's default pretrained weights, found in the local Hugging Face cache (HF_HUB_CACHE)
  or torch hub cache (TORCH_HOME) where an earlier download left them. Nothing is ever fetched: a cache without them
  is a one-line error that names where they were looked for.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from torch import nn

from eigtrain.models.encoder import context_config
from eigtrain.schema import ConfigError, ModelConfig

CACHE = "cache"
_HF_FILES = ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


class PretrainedWeightsError(ValueError):
    """model.pretrained cannot be used: one line naming the file (or cache) and the cause."""


def timm_name(cfg: ModelConfig) -> str | None:
    """The timm model name of the backbone (model.backbone=timm:NAME or a named timm backbone), or None."""
    from eigtrain.models.backbones import _TIMM_NAMES

    if cfg.backbone.startswith("timm:"):
        return cfg.backbone.removeprefix("timm:")
    return _TIMM_NAMES.get(cfg.backbone)


def check_pretrained(cfg: ModelConfig) -> None:
    """ConfigError (one line) unless model.pretrained is unset or on this machine; called before any work."""
    try:
        resolve_pretrained(cfg)
    except PretrainedWeightsError as error:
        raise ConfigError(str(error)) from None


def resolve_pretrained(cfg: ModelConfig) -> Path | None:
    """The file model.pretrained names (None when unset); PretrainedWeightsError when it is not on this machine."""
    if not cfg.pretrained:
        return None
    if cfg.pretrained != CACHE:
        path = Path(str(cfg.pretrained)).expanduser()
        if not path.is_file():
            raise PretrainedWeightsError(
                f"model.pretrained={cfg.pretrained}: no such file (weights are never downloaded)"
            )
        return path
    name = timm_name(cfg)
    if name is None:
        raise PretrainedWeightsError(f"model.pretrained=cache needs a timm backbone, not model.backbone={cfg.backbone}")
    return _cached_file(name)


def _cached_file(name: str) -> Path:
    """timm's default pretrained file for `name`, from the local caches only."""
    from timm.models import get_pretrained_cfg

    pretrained_cfg = get_pretrained_cfg(name)
    if pretrained_cfg is None:
        raise PretrainedWeightsError(f"model.pretrained=cache: timm has no pretrained weights for {name!r}")
    looked: list[str] = []
    if pretrained_cfg.hf_hub_id:
        from huggingface_hub import constants, try_to_load_from_cache

        repo = pretrained_cfg.hf_hub_id
        for filename in [pretrained_cfg.hf_hub_filename] if pretrained_cfg.hf_hub_filename else _HF_FILES:
            found = try_to_load_from_cache(repo, filename)
            if isinstance(found, str) and Path(found).is_file():
                return Path(found)
        looked.append(f"Hugging Face cache {constants.HF_HUB_CACHE} (repo {repo})")
    if pretrained_cfg.url:
        import torch.hub

        path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(str(pretrained_cfg.url).split("?")[0])
        if path.is_file():
            return path
        looked.append(f"torch hub cache {path}")
    raise PretrainedWeightsError(
        f"model.pretrained=cache: the weights of {name} are not in the {' or the '.join(looked) or 'local caches'} "
        f"(weights are never downloaded at run time: fetch them beforehand, or pass model.pretrained=FILE)"
    )


def load_pretrained(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """Load model.pretrained into the encoder's backbone (both encoders of a PairEncoder, unless model.context
    sets its own pretrained); the model unchanged when unset."""
    phi = getattr(model, "phi", model)
    _load_backbone(getattr(phi, "backbone"), cfg)
    psi = getattr(model, "psi", None)
    if psi is not None:
        _load_backbone(getattr(psi, "backbone"), context_config(cfg))
    return model


def _load_backbone(backbone: nn.Module, cfg: ModelConfig) -> None:
    path = resolve_pretrained(cfg)
    if path is None:
        return
    from timm.models import load_state_dict

    try:
        state = load_state_dict(str(path), use_ema=False, weights_only=True)  # never unpickles code
    except Exception as error:  # noqa: BLE001  (not safetensors, not a weights-only torch file, truncated...)
        raise PretrainedWeightsError(f"model.pretrained={path} cannot be read: {_first_line(error)}") from None
    classifier = getattr(backbone, "pretrained_cfg", {}).get("classifier") or ()
    droppable = tuple(f"{n}." for n in ([classifier] if isinstance(classifier, str) else classifier))
    state = {k: v for k, v in state.items() if not k.startswith(droppable)}
    convert = getattr(sys.modules[type(backbone).__module__], "checkpoint_filter_fn", None)
    if convert is not None and hasattr(backbone, "pretrained_cfg"):  # timm's: resample position embeddings, etc.
        state = convert(state, backbone)
    try:
        missing, unexpected = backbone.load_state_dict(state, strict=False)
    except RuntimeError as error:  # a tensor of another shape
        raise PretrainedWeightsError(
            f"model.pretrained={path} does not fit model.backbone={cfg.backbone}: {_first_line(error, last=True)}"
        ) from None
    if missing or unexpected:
        raise PretrainedWeightsError(
            f"model.pretrained={path} does not fit model.backbone={cfg.backbone}: {len(missing)} missing key(s) "
            f"{missing[:3]}, {len(unexpected)} unexpected key(s) {unexpected[:3]}"
        )


def _first_line(error: BaseException, last: bool = False) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else type(error).__name__


def stated_normalization(cfg: ModelConfig) -> tuple[tuple[float, ...], tuple[float, ...], str] | None:
    """(mean, std, where) that model.pretrained's weights state: a file's own (`file_normalization`); for
    ``cache``, timm's pretrained_cfg of the backbone. None when not pretrained or when they state none."""
    path = resolve_pretrained(cfg)
    if path is None:
        return None
    if cfg.pretrained != CACHE:
        return file_normalization(path)
    from timm.models import get_pretrained_cfg

    name = timm_name(cfg)
    pretrained_cfg = get_pretrained_cfg(name) if name else None
    if pretrained_cfg is None or not pretrained_cfg.mean or not pretrained_cfg.std:
        return file_normalization(path)
    return tuple(pretrained_cfg.mean), tuple(pretrained_cfg.std), f"timm's pretrained_cfg of {name}"


def file_normalization(path: str | os.PathLike | None) -> tuple[tuple[float, ...], tuple[float, ...], str] | None:
    """(mean, std, where) a weights file states: its safetensors metadata ``mean`` and ``std`` (JSON lists), else
    the ``pretrained_cfg`` of a timm ``config.json`` beside it (a Hugging Face snapshot's layout); None otherwise."""
    if path is None:
        return None
    path = Path(path)
    stated: dict = {}
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "pt") as weights:
                meta = weights.metadata() or {}
            stated = {k: json.loads(meta[k]) for k in ("mean", "std") if k in meta}
        except Exception as error:  # noqa: BLE001  (not safetensors, bad JSON: the loader names the file too)
            raise PretrainedWeightsError(f"{path}: cannot read its metadata: {_first_line(error)}") from None
        where = f"the metadata of {path}"
    if not stated and (path.parent / "config.json").is_file():
        try:
            stated = json.loads((path.parent / "config.json").read_text()).get("pretrained_cfg") or {}
        except (OSError, ValueError, AttributeError):
            stated = {}
        where = f"the pretrained_cfg of {path.parent / 'config.json'}"
    mean, std = stated.get("mean"), stated.get("std")
    if not isinstance(mean, list) or not isinstance(std, list) or not mean or not std:
        return None
    try:
        return tuple(float(v) for v in mean), tuple(float(v) for v in std), where
    except (TypeError, ValueError):
        raise PretrainedWeightsError(f"{where}: mean/std are not lists of numbers ({mean}, {std})") from None
