"""Validation of a composed config against the dataclasses (eigtrain.schema.groups), and typed views of it.

Every failure is one ``ConfigError`` line naming the key and what is allowed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from eigtrain.schema.groups import LAUNCHER_SCHEMAS, OPTIM_SCHEMAS, TrainConfig
from eigtrain.schema.objectives import OBJECTIVE_SCHEMAS

T = TypeVar("T")


class ConfigError(ValueError):
    """A bad training config: names the key and what is allowed."""


_BY_NAME: dict[str, dict[str, Any]] = {
    "objective": OBJECTIVE_SCHEMAS,
    "optim": OPTIM_SCHEMAS,
    "launcher": LAUNCHER_SCHEMAS,
}
NAMED_GROUPS = ("objective", "optim", "launcher")  # groups whose keys depend on the option's name


def _group_schema(group: str, name: Any) -> type:
    schemas = _BY_NAME[group]
    if name not in schemas:
        raise ConfigError(f"{group}.name={name!r} is not allowed; allowed: {', '.join(schemas)}")
    return schemas[name]


def typed(schema: type[T], node: Any) -> T:
    """`node` as an instance of dataclass `schema`, at a boundary where a config arrives untyped (a run's saved
    config.yaml, model.context's keys): builders take the instance. `node` may be a DictConfig, a mapping of some
    keys (the rest take the schema's defaults) or already a `schema` instance. An unknown key or a bad value is a
    ConfigError naming the key."""
    if isinstance(node, schema):
        return node
    if isinstance(node, DictConfig):  # interpolations resolve against the whole config, not the copy
        node = OmegaConf.to_container(node, resolve=True)
    try:
        return cast(T, OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node)))
    except OmegaConfBaseException as error:
        raise ConfigError(describe(error)) from None


def typed_option(group: str, node: Any) -> Any:
    """A name-keyed group's option (objective, optim, launcher) as its own dataclass, chosen by `name`."""
    if dataclasses.is_dataclass(node):
        return node
    return typed(_group_schema(group, node["name"]), node)


def check(cfg: DictConfig) -> None:
    """Raise ConfigError (one line, naming the key) unless `cfg` fits the schema.

    Hydra already applies `TrainConfig` while composing; this also covers configs built or changed in
    code, `+key=value` additions, and the groups whose keys depend on the option's name.
    """
    rest = OmegaConf.create(cast(dict, OmegaConf.to_container(cfg, resolve=False)))
    for group in NAMED_GROUPS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{group} must be a config group option, got {node!r}")
        _fits(_group_schema(group, node.get("name")), node, prefix=group)
        rest[group] = None
    _fits(TrainConfig, rest)
    fill_option_defaults(cfg)


def train_config(cfg: DictConfig) -> TrainConfig:
    """The composed training config as its dataclass, each name-keyed group as its option's: the one conversion of
    a training job's config (`check` first). Its parts are what the components take (interpolations resolved)."""
    check(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    try:
        node = OmegaConf.merge(
            OmegaConf.structured(TrainConfig), {k: v for k, v in plain.items() if k not in NAMED_GROUPS}
        )
        for group in NAMED_GROUPS:
            schema = _group_schema(group, plain[group]["name"])
            cast(DictConfig, node)[group] = OmegaConf.merge(OmegaConf.structured(schema), plain[group])
        return OmegaConf.to_object(node)  # type: ignore[return-value]
    except OmegaConfBaseException as error:
        raise ConfigError(describe(error)) from None


def fill_option_defaults(cfg: DictConfig) -> None:
    """Give each name-keyed group (objective, optim, launcher) every key of its option's dataclass: their files
    set only what differs from it, the code reads every key. Interpolations stay (resolved against `cfg`)."""
    for group in NAMED_GROUPS:
        node = cfg[group]
        cfg[group] = OmegaConf.merge(OmegaConf.structured(_group_schema(group, node.name)), node)


def _fits(schema: type, node: DictConfig, prefix: str = "") -> None:
    try:  # as plain values: a node already typed by `schema` would keep a key added to it with +key=...
        OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.to_container(node, resolve=False))
    except OmegaConfBaseException as error:
        raise ConfigError(describe(error, prefix)) from None


def describe(error: OmegaConfBaseException, prefix: str = "") -> str:
    """One line for an OmegaConf error: the full key, what went wrong and, for an unknown key, the
    allowed keys."""
    key = getattr(error, "full_key", None) or ""
    key = f"{prefix}.{key}" if prefix and key else key
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    unknown = "not in" in message or "is not in struct" in message
    if isinstance(error, (ConfigKeyError, ConfigAttributeError)) and unknown:
        allowed = _allowed_keys(error, key)
        if allowed:
            return f"unknown key {key!r}; allowed: {', '.join(allowed)}"
        return f"unknown key {key!r}; a new entry of a dict is added with +{key}=..."
    if isinstance(error, ValidationError):
        return f"bad value for {key}: {message}"
    return f"{key}: {message}" if key else message


def _allowed_keys(error: OmegaConfBaseException, key: str) -> list[str]:
    schema = getattr(error, "object_type", None)
    parent = getattr(error, "parent_node", None)
    group = key.split(".")[0] if key.count(".") == 1 else None
    if group in NAMED_GROUPS and isinstance(parent, DictConfig) and "name" in parent:
        try:
            schema = _group_schema(group, parent.name)
        except ConfigError:
            pass
    if dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    return [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
