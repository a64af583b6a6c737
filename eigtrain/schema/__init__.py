"""The typed schema of eigtrain-train's config: every key, its type, its default and one line of doc, in one place.

- groups.py: the dataclasses (a field per key, its default, its doc as the trailing comment); name-keyed groups
  (objective, optim, launcher) have one dataclass per option;
- check.py: `check` (unknown keys, bad types, option names; fills each option's defaults) and `typed` (a group
  as its dataclass: what builders take);
- combinations.py: `validate` (choices from the registries, combinations, batch arithmetic);
- naming.py: sweep point directory names.

Adding a key is one line in groups.py; a yaml file sets it only where its value differs from that default
(tests/config/test_yaml_defaults.py). Hydra composes configs/train.yaml on top of `TrainConfig` (registered in the
ConfigStore as `train_schema`, the first entry of train.yaml's defaults list), so an unknown key or a value of the
wrong type in any option file, experiment or override -- also in option files added through `hydra.searchpath` --
is an error naming the key.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from eigtrain.schema.check import NAMED_GROUPS, ConfigError, check, describe, fill_option_defaults, typed, typed_option
from eigtrain.schema.groups import (
    LAUNCHER_SCHEMAS,
    OPTIM_SCHEMAS,
    AdamWConfig,
    DataConfig,
    EngineConfig,
    LarsConfig,
    LocalLauncherConfig,
    LoggingConfig,
    ModelConfig,
    MonitorConfig,
    NestingConfig,
    OptimBase,
    SGDConfig,
    SlurmLauncherConfig,
    TrainConfig,
    WandbConfig,
    objective_schema,
)
from eigtrain.schema.naming import NOT_RESULT_KEYS, names_point, sweep_point


def register() -> None:
    """Put the schema into Hydra's ConfigStore and register the resolvers the yaml files use. train.yaml's defaults
    list names `train_schema`; each objective, optim and launcher file names its option's dataclass first
    (`/schema/optim/sgd@_here_`), so its keys are all there, typed, when the command line overrides one."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    from eigtrain.objectives import OBJECTIVES  # pure tensor code: no import of this package

    options = {
        "objective": {name: objective_schema(name) for name in OBJECTIVES},
        "optim": OPTIM_SCHEMAS,
        "launcher": LAUNCHER_SCHEMAS,
    }
    for group, schemas in options.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)
    OmegaConf.register_new_resolver("eigtrain.sweep_point", sweep_point, replace=True)
    # launcher=slurm: one CPU per DataLoader worker plus the training process
    OmegaConf.register_new_resolver("eigtrain.cpus_for_workers", lambda workers: int(workers) + 1, replace=True)


register()


def __getattr__(name: str):
    if name == "validate":  # lazily: it imports the builders, which import this package
        from eigtrain.schema.combinations import validate

        return validate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AdamWConfig",
    "ConfigError",
    "DataConfig",
    "EngineConfig",
    "LAUNCHER_SCHEMAS",
    "LarsConfig",
    "LocalLauncherConfig",
    "LoggingConfig",
    "ModelConfig",
    "MonitorConfig",
    "NAMED_GROUPS",
    "NOT_RESULT_KEYS",
    "NestingConfig",
    "OPTIM_SCHEMAS",
    "OptimBase",
    "SGDConfig",
    "SlurmLauncherConfig",
    "TrainConfig",
    "WandbConfig",
    "check",
    "describe",
    "fill_option_defaults",
    "names_point",
    "objective_schema",
    "register",
    "sweep_point",
    "typed",
    "typed_option",
    "validate",
]
