"""The training configuration as the command line composes it (Hydra, with configs/ shipped as eigtrain.configs),
without torch: eigtrain-train checks every point of its command line against the schema (keys, types, choices),
and answers -h / --help, before the trainer (torch, torchvision, DeepSpeed) is imported (eigtrain.commands)."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from eigtrain.schema import train_config
from eigtrain.train.sweep_naming import register_resolvers

CONFIG_PACKAGE = "eigtrain.configs"  # configs/ of the repository, shipped inside the package (pyproject.toml)
register_resolvers()  # before any composition of configs/train.yaml


def compose_config(overrides: Sequence[str] = (), config_name: str = "train") -> DictConfig:
    """The composed training config, as the command line would build it (for tests, tools, launchers)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_PACKAGE, version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def check_schema(overrides: list[str], config_name: str | None) -> None:
    """One point of the command line against the schema: an unknown key, a wrong type or a value outside its
    choices raises (ConfigError, one line). The trainer's own checks (data, devices, batch split) follow it."""
    train_config(compose_config(overrides, config_name or "train"))


def hydra_app_help() -> None:
    """Hydra's answer to -h / --help / --hydra-help (the configuration groups and the composed defaults), from the
    same app eigtrain.train.command runs, without the trainer's imports. Hydra prints it and exits."""
    import hydra

    @hydra.main(config_path=f"pkg://{CONFIG_PACKAGE}", config_name="train", version_base="1.3")
    def _help_only(cfg: DictConfig) -> None:  # never called: Hydra answers the help flags before any task
        raise AssertionError("hydra_app_help is for -h / --help only")

    _help_only()
