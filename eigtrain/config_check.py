"""Checks of the composed training config, run before any expensive work.

Every failure is one ``ConfigError`` naming the key and the allowed values. (Hydra already rejects
unknown keys on the command line; this also covers configs built in code and ``+key=`` additions.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch
from omegaconf import DictConfig, OmegaConf

from eigtrain.data.augment import PRESETS
from eigtrain.engine import ENGINES, OPTIMIZERS, PRECISIONS, SCHEDULES
from eigtrain.engine.deepspeed_zero import ZERO_STAGES
from eigtrain.metrics_log import WANDB_MODES
from eigtrain.models import BACKBONES
from eigtrain.objectives import OBJECTIVES

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
GROUPS = ("objective", "nesting", "model", "data", "engine", "optim", "launcher")
NESTING_MODES = ("none", "joint", "sequential")
DATA_MODES = ("views", "pairs")


class ConfigError(ValueError):
    """A bad training config: names the key and what is allowed."""


def _known_keys() -> dict[str, set[str]]:
    """Top-level keys of train.yaml, and per group the union of the keys of its option files."""
    known = {"": set(OmegaConf.load(CONFIG_DIR / "train.yaml")) | set(GROUPS) | {"experiment"}}
    for group in GROUPS:
        known[group] = set().union(*(set(OmegaConf.load(f)) for f in (CONFIG_DIR / group).glob("*.yaml")))
    return known


def _check_known_keys(cfg: DictConfig) -> None:
    known = _known_keys()
    for key in cfg:
        if key not in known[""]:
            raise ConfigError(f"unknown config key {key!r}; allowed: {', '.join(sorted(known['']))}")
    for group in GROUPS:
        for key in cfg.get(group) or {}:
            if key not in known[group]:
                raise ConfigError(f"unknown config key '{group}.{key}'; allowed: {', '.join(sorted(known[group]))}")


def _choice(key: str, value: Any, allowed: Iterable[Any]) -> None:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


def _positive_int(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def validate(cfg: DictConfig, world_size: int) -> tuple[int, int]:
    """Check ``cfg`` for a job of ``world_size`` ranks; return (micro_batch_size, grad_accum_steps)."""
    _check_known_keys(cfg)
    _choice("objective.name", cfg.objective.name, OBJECTIVES)
    _choice("nesting.mode", cfg.nesting.mode, NESTING_MODES)
    _choice("model.backbone", cfg.model.backbone, BACKBONES)
    _choice("data.mode", cfg.data.mode, DATA_MODES)
    _choice("data.augment", cfg.data.augment, PRESETS)
    _choice("engine.name", cfg.engine.name, ENGINES)
    _choice("engine.precision", cfg.engine.precision, PRECISIONS)
    _choice("optim.name", cfg.optim.name, OPTIMIZERS)
    _choice("optim.schedule", cfg.optim.schedule, SCHEDULES)
    _choice("logging.wandb.mode", cfg.logging.wandb.mode, WANDB_MODES)
    _choice("device", cfg.device, ("auto", "cpu", "cuda"))
    if cfg.engine.name == "deepspeed":
        _choice("engine.zero_stage", cfg.engine.zero_stage, ZERO_STAGES)
    for key in ("steps", "batch_size", "dim", "checkpoint_every", "log_every", "keep_last"):
        _positive_int(key, cfg[key])
    for key in ("stop_after", "micro_batch_size", "cpu_threads"):
        if cfg[key] is not None:
            _positive_int(key, cfg[key])
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no GPU is visible; use device=auto or device=cpu")

    objective = OBJECTIVES[cfg.objective.name]
    pairs = cfg.data.mode == "pairs"
    if pairs and not objective.allows_pairs:
        with_pairs = [n for n, o in OBJECTIVES.items() if o.allows_pairs]
        raise ConfigError(f"objective={cfg.objective.name} trains one encoder on two views (data.mode=views); "
                          f"with data.mode=pairs use objective: {', '.join(with_pairs)}")
    if not pairs and objective.default_pairs:
        raise ConfigError(f"objective={cfg.objective.name} trains two encoders on stored pairs and needs "
                          f"data.mode=pairs; for two views of one image use objective=scl")

    micro = cfg.micro_batch_size if cfg.micro_batch_size is not None else cfg.batch_size // world_size
    _positive_int("micro_batch_size", micro)
    if cfg.batch_size % (world_size * micro):
        raise ConfigError(f"batch_size={cfg.batch_size} must be divisible by world size x micro_batch_size = "
                          f"{world_size} x {micro}")
    if objective.split_batch and micro % 2:
        raise ConfigError(f"objective={cfg.objective.name} splits each per-rank micro-batch into even/odd halves: "
                          f"micro_batch_size (batch_size / world size / accumulation) must be even, got {micro}")
    return micro, cfg.batch_size // (world_size * micro)
