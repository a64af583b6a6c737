"""Choices and combinations of the composed training config, checked before any expensive work.

Every failure is one ``ConfigError`` naming the key and the allowed values. Unknown keys and bad types are
`check`'s job (eigtrain.schema.check); this adds the choices (the schema's Literal aliases, each equal to the
registry that uses it: tests/config/test_schema_leaf.py) and the combinations a type cannot express. It sits beside
the entry point that composes the groups (eigtrain.train.command), above the schema, which imports nothing of eigtrain's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, get_args

import torch
from omegaconf import DictConfig

from eigtrain.data.from_config import check_data, check_splits
from eigtrain.data.index import INDEX_NAME, read_index
from eigtrain.data.normalization import Normalization, NormalizationError, Stated, decide
from eigtrain.models.backbones import check_timm_backbone
from eigtrain.models.pretrained import check_pretrained, stated_normalization
from eigtrain.objectives import OBJECTIVES
from eigtrain.schema import ConfigError, TrainConfig, train_config
from eigtrain.schema import groups as g


def _choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def _positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def _check_backbone_options(model: g.ModelConfig) -> None:
    """An option of one backbone family set on another would be ignored without a word: one line instead."""
    _positive_int("model.pool", model.pool)
    if model.pool != 1 and model.backbone != "tiny_cnn":
        raise ConfigError(
            f"model.pool={model.pool} is the tiny_cnn's pooled grid; model.backbone={model.backbone} pools as it is "
            f"built: drop model.pool (or use backbone tiny_cnn)"
        )
    if model.cifar_stem and model.backbone not in ("resnet18", "resnet50"):
        raise ConfigError(
            f"model.cifar_stem=true replaces a ResNet's stem (resnet18, resnet50); model.backbone={model.backbone} "
            f"has none: drop model.cifar_stem"
        )


def validate(cfg: DictConfig | TrainConfig, world_size: int) -> tuple[int, int]:
    """Check ``cfg`` for a job of ``world_size`` ranks; return (micro_batch_size, grad_accum_steps). ``cfg``: the
    job's TrainConfig (`train_config`, which also checks keys and types), or the composed config, converted here."""
    if isinstance(cfg, DictConfig):
        cfg = train_config(cfg)  # unknown keys, bad types, and objective/optim/launcher names
    _choice("nesting.mode", cfg.nesting.mode, get_args(g.NestingMode))
    if not str(cfg.model.backbone).startswith("timm:"):  # timm:NAME: any timm model (eigtrain.models.backbones)
        _choice("model.backbone", cfg.model.backbone, get_args(g.Backbone))
    else:
        try:
            check_timm_backbone(cfg.model.backbone)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    _check_backbone_options(cfg.model)
    check_pretrained(cfg.model)  # the weights are on this machine: else one line, before any work
    _choice("data.mode", cfg.data.mode, get_args(g.DataMode))
    _choice("data.augment", cfg.data.augment, get_args(g.AugmentPreset))
    _choice("engine.name", cfg.engine.name, get_args(g.Engine))
    _choice("engine.precision", cfg.engine.precision, get_args(g.Precision))
    _choice("optim.schedule", cfg.optim.schedule, get_args(g.Schedule))
    _choice("logging.wandb.mode", cfg.logging.wandb.mode, get_args(g.WandbMode))
    _choice("device", cfg.device, get_args(g.Device))
    if cfg.engine.name == "deepspeed":
        _choice("engine.zero_stage", cfg.engine.zero_stage, get_args(g.ZeroStage))
    for key in ("steps", "batch_size", "dim", "checkpoint_every", "log_every", "keep_last", "signal_check_every"):
        _positive_int(key, getattr(cfg, key))
    for key in ("stop_after", "micro_batch_size", "cpu_threads"):
        if getattr(cfg, key) is not None:
            _positive_int(key, getattr(cfg, key))
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no GPU is visible; use device=auto or device=cpu")

    objective = OBJECTIVES[cfg.objective.name]
    pairs = cfg.data.mode == "pairs"
    if pairs and not objective.allows_pairs:
        with_pairs = [n for n, o in OBJECTIVES.items() if o.allows_pairs]
        raise ConfigError(
            f"objective={cfg.objective.name} trains one encoder on two views (data.mode=views); "
            f"with data.mode=pairs use objective: {', '.join(with_pairs)}"
        )
    if not pairs and objective.default_pairs:
        raise ConfigError(
            f"objective={cfg.objective.name} trains two encoders on stored pairs and needs "
            f"data.mode=pairs; for two views of one image use objective=scl"
        )

    micro, accum = batch_split(cfg, world_size)
    _positive_int("micro_batch_size", micro)
    if cfg.batch_size % (world_size * micro):
        raise ConfigError(
            f"batch_size={cfg.batch_size} must be divisible by world size x micro_batch_size = {world_size} x {micro}"
        )
    if objective.split_batch and micro % 2:
        raise ConfigError(
            f"objective={cfg.objective.name} splits each per-rank micro-batch into even/odd halves: "
            f"micro_batch_size (batch_size / world size / accumulation) must be even, got {micro}"
        )
    try:  # data keys, and the data against ranks x workers where that is cheap to know (also on a login node)
        check_data(cfg.data, world_size, cfg.batch_size // world_size)
        if cfg.monitor.every:  # data.shards: the monitor's val split is data.val_shards, never the training shards
            check_splits(cfg.data, (cfg.monitor.train_split, cfg.monitor.val_split))
            _check_monitor_splits_in_index(cfg)
    except ValueError as exn:
        raise ConfigError(str(exn)) from None
    channels = _known_channels(cfg)
    if channels is not None:  # else checked once the data is prepared (eigtrain.train.command)
        decide_normalization(cfg, channels)
    return micro, accum


def decide_normalization(cfg: TrainConfig, channels: int) -> tuple[Normalization, str | None]:
    """The run's normalization and a warning or None (eigtrain.data.normalization.decide: data.mean/std, else what
    model.pretrained's weights state, else the preset's); a ConfigError when it does not fit the channels."""
    stated = stated_normalization(cfg.model)
    try:
        return decide(cfg.data.augment, cfg.data.mean, cfg.data.std, channels, Stated(*stated) if stated else None)
    except NormalizationError as error:
        raise ConfigError(str(error)) from None


def _known_channels(cfg: TrainConfig) -> int | None:
    """The images' channels where that is cheap to know: 3 for data.shards (decoded RGB), data.root's index."""
    if cfg.data.shards:
        return 3
    if cfg.data.root is None or not (Path(cfg.data.root) / INDEX_NAME).is_file():
        return None
    meta = read_index(cfg.data.root).meta
    return int(meta["channels"] if "channels" in meta else meta["image_shape"][0])


def batch_split(cfg: TrainConfig | DictConfig, world_size: int) -> tuple[int, int]:
    """(micro_batch_size, grad_accum_steps) of a job of `world_size` ranks (`validate` checks they divide)."""
    micro = cfg.micro_batch_size if cfg.micro_batch_size is not None else cfg.batch_size // world_size
    return micro, cfg.batch_size // (world_size * micro) if micro > 0 else 0


def _check_monitor_splits_in_index(cfg: TrainConfig) -> None:
    """data.root's index, when it is already written, holds the monitor's splits: a missing one stopped the run
    at the monitor's set-up, after the run directory was claimed, with a message that did not name the key."""
    root = cfg.data.root
    if cfg.data.shards or root is None or not (Path(root) / INDEX_NAME).is_file():
        return
    available = read_index(root).splits
    for key in ("train_split", "val_split"):
        if getattr(cfg.monitor, key) not in available:
            raise ConfigError(
                f"monitor.{key}={getattr(cfg.monitor, key)} is not a split of data.root={cfg.data.root}; "
                f"its index.json has: {', '.join(sorted(available))}"
            )
