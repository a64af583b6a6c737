"""configs/**/*.yaml set only what differs from the defaults: each default is written once, in eigtrain/schema.

A group file is compared with its group's dataclass (objective, optim and launcher files with the dataclass of
the option they name), train.yaml with TrainConfig, and an experiment with the config it starts from (train.yaml
and the options its defaults list picks): a value equal to the one it would have anyway is a restated default.
"""

import dataclasses
from pathlib import Path

import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from eigtrain.schema import (
    LAUNCHER_SCHEMAS,
    OPTIM_SCHEMAS,
    DataConfig,
    EngineConfig,
    ModelConfig,
    NestingConfig,
    TrainConfig,
    fill_option_defaults,
    objective_schema,
)
from eigtrain.train.command import compose_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GROUPS = {
    "data": DataConfig,
    "engine": EngineConfig,
    "model": ModelConfig,
    "nesting": NestingConfig,
    "optim": OPTIM_SCHEMAS.get,
    "launcher": LAUNCHER_SCHEMAS.get,
    "objective": objective_schema,
}
FILES = sorted(p.relative_to(CONFIGS).as_posix() for p in CONFIGS.rglob("*.yaml"))


def _defaults(schema: type) -> dict:
    """Each field's default (nested dataclasses as dicts); MISSING for a field without one."""
    out = {}
    for f in dataclasses.fields(schema):
        if f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = _defaults(type(value)) if dataclasses.is_dataclass(value) else value
        else:
            out[f.name] = MISSING if f.default is dataclasses.MISSING else f.default
    return out


def _restated(body: dict, defaults: dict, prefix: str = "") -> list[str]:
    found = []
    for key, value in body.items():
        if key in ("defaults", "hydra") or key not in defaults:
            continue
        default = defaults[key]
        if isinstance(value, dict) and isinstance(default, dict) and value:
            found += _restated(value, default, f"{prefix}{key}.")
        elif value == default and type(value) in (type(default), type(None)) or _same_number(value, default):
            found.append(f"{prefix}{key}: {value!r}")
    return found


def _same_number(value, default) -> bool:
    numbers = (int, float)
    return (
        isinstance(value, numbers)
        and isinstance(default, numbers)
        and not isinstance(value, bool)
        and not isinstance(default, bool)
        and value == default
    )


def _composed_without_body(body: dict) -> dict:
    """The config an experiment starts from: train.yaml with the options of the experiment's defaults list."""
    picks = [
        f"{k.split('/')[-1]}={v}"
        for item in body.get("defaults", [])
        if isinstance(item, dict)
        for k, v in item.items()
        if k.startswith("override ")
    ]
    cfg = compose_config(picks)
    fill_option_defaults(cfg)
    return OmegaConf.to_container(cfg, resolve=False)


@pytest.mark.parametrize("name", FILES)
def test_yaml_sets_only_what_differs_from_the_defaults(name):
    body = yaml.safe_load((CONFIGS / name).read_text()) or {}
    group = name.split("/")[0] if "/" in name else None
    if group == "experiment":
        defaults = _composed_without_body(body)
    elif group is None:
        defaults = _defaults(TrainConfig)
    else:
        schema = GROUPS[group]  # a name-keyed group: the option's own dataclass, by the file's name
        defaults = _defaults(schema if dataclasses.is_dataclass(schema) else schema(Path(name).stem))
    restated = _restated(body, defaults)
    assert not restated, f"configs/{name} restates defaults (remove them; the schema holds them): {restated}"


def test_the_check_sees_a_restated_default():
    assert _restated({"lr": 0.1, "momentum": 0.9, "nesterov": True}, _defaults(OPTIM_SCHEMAS["sgd"])) == [
        "lr: 0.1",
        "momentum: 0.9",
    ]
    assert _restated({"logging": {"wandb": {"mode": "offline"}}, "steps": 5}, _defaults(TrainConfig)) == [
        "logging.wandb.mode: 'offline'"
    ]


@pytest.mark.parametrize(
    "overrides, key, value",
    [
        (["optim.momentum=0.5"], "optim.momentum", 0.5),  # sgd.yaml does not set it: its dataclass brings it
        (["objective=rq", "objective.mu=3"], "objective.mu", 3.0),
        (["launcher=slurm", "launcher.gpus_per_node=2"], "launcher.gpus_per_node", 2),
    ],
)
def test_a_key_its_option_file_leaves_to_the_default_takes_an_override(overrides, key, value):
    assert OmegaConf.select(compose_config(overrides), key) == value
