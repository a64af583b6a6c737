"""The typed schema of eigtrain-train's config: every key, its type, its default and one line of doc, in one place.

- groups.py: the dataclasses (a field per key, its default, its doc as the trailing comment); name-keyed groups
  (objective, optim, launcher) have one dataclass per option;
- check.py: `check` (unknown keys, bad types, option names; fills each option's defaults), `train_config` (the
  one conversion of a command's config) and `typed` (a group as its dataclass where it arrives untyped: a saved
  config.yaml); builders take the dataclasses;
- objectives.py: the objective group's dataclasses (one per objective; the objectives read their defaults here).

The schema is a leaf: it imports nothing of eigtrain's (tests/config/test_schema_leaf.py). What needs the registries
or the data -- `validate` (choices, combinations, batch arithmetic) -- is eigtrain.train.checks; sweep point names
and the yaml files' resolvers are eigtrain.train.sweep_naming.

Adding a key is one line in groups.py; a yaml file sets it only where its value differs from that default
(tests/config/test_yaml_defaults.py). Hydra composes configs/train.yaml on top of `TrainConfig` (registered in the
ConfigStore as `train_schema`, the first entry of train.yaml's defaults list), so an unknown key or a value of the
wrong type in any option file, experiment or override -- also in option files added through `hydra.searchpath` --
is an error naming the key.
"""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from eigtrain.schema.check import (
    NAMED_GROUPS,
    ConfigError,
    check,
    describe,
    fill_option_defaults,
    train_config,
    typed,
    typed_option,
)
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
from eigtrain.schema.objectives import (
    OBJECTIVE_SCHEMAS,
    LoraConfig,
    ObjectiveBase,
    RqConfig,
    RqDirectConfig,
    SclConfig,
    VicregConfig,
    VicregPaperConfig,
)


def register() -> None:
    """Put the schema into Hydra's ConfigStore. train.yaml's defaults list names `train_schema`; each objective,
    optim and launcher file names its option's dataclass first (`/schema/optim/sgd@_here_`), so its keys are all
    there, typed, when the command line overrides one."""
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    options = {"objective": OBJECTIVE_SCHEMAS, "optim": OPTIM_SCHEMAS, "launcher": LAUNCHER_SCHEMAS}
    for group, schemas in options.items():
        for name, schema in schemas.items():
            store.store(group=f"schema/{group}", name=name, node=schema)


register()


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
    "NestingConfig",
    "OBJECTIVE_SCHEMAS",
    "ObjectiveBase",
    "LoraConfig",
    "SclConfig",
    "RqConfig",
    "RqDirectConfig",
    "VicregConfig",
    "VicregPaperConfig",
    "OPTIM_SCHEMAS",
    "OptimBase",
    "SGDConfig",
    "SlurmLauncherConfig",
    "TrainConfig",
    "WandbConfig",
    "check",
    "describe",
    "fill_option_defaults",
    "objective_schema",
    "register",
    "train_config",
    "typed",
    "typed_option",
]
