"""The typed schema of eigtrain-train's config: every key, its type and its default, in one place.

Adding a key is one line here (a field with its default) plus, where it documents a choice, the value in
the group's yaml files. Hydra composes configs/train.yaml on top of `TrainConfig` (registered in the
ConfigStore as `train_schema`, the first entry of train.yaml's defaults list), so an unknown key or a value
of the wrong type in any option file, experiment or override -- also in option files added through
`hydra.searchpath` -- is an error naming the key. Groups whose keys depend on the option's `name`
(objective, optim, launcher) are checked against that option's dataclass by `check`:
- objective: generated from the objective class's `defaults` (eigtrain.objectives), so a coefficient is
  declared once, next to the loss that uses it;
- optim and launcher: the dataclasses below.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from eigtrain.redact import redact_url


class ConfigError(ValueError):
    """A bad training config: names the key and what is allowed."""


# ------------------------------------------------------------------------------------------ groups

@dataclass
class NestingConfig:
    mode: str = "none"  # none | joint | sequential
    prefixes: Any = None  # all | mrl | a list of prefix lengths
    weights: Optional[List[float]] = None  # null = uniform


@dataclass
class ModelConfig:
    backbone: str = "tiny_cnn"
    width: int = 32
    depth: int = 4
    cifar_stem: bool = False
    patch_size: int = 16
    projector_hidden: int = 128
    projector_layers: int = 1
    projector_batch_norm: bool = True
    sync_batch_norm: bool = False
    context: Any = None  # pairs data: a dict of the psi encoder's keys that differ from phi's


@dataclass
class DataConfig:
    root: Optional[str] = None
    split: str = "train"
    mode: str = "views"  # views | pairs
    num_workers: int = 1
    image_size: Optional[List[int]] = None
    view_size: Optional[List[int]] = None
    resampled: bool = False
    max_corrupt: int = 10
    augment: str = "digits"
    mean: Optional[List[float]] = None
    std: Optional[List[float]] = None
    write_if_missing: Optional[str] = None
    shard_size: int = 1000
    shards: Any = None  # a brace pattern or a list of URLs
    val_shards: Any = None  # held-out shards of split 'val' (pattern or list, read like shards): eval, rr, monitor
    allow_pipe: bool = False  # eigtrain-eval/-rr command line: run pipe: sources read back from a saved config
    shard_index: Optional[str] = None
    image_key: Optional[str] = None
    label_key: Optional[str] = None
    x_key: Optional[str] = None
    a_key: Optional[str] = None
    image_fit: str = "cover"
    shuffle_block: int = 1000
    mix_shards: int = 8
    decode: str = "cpu"  # auto | cpu | cuda: cpu until a GPU run shows nvJPEG bit-identical to it
    pin_memory: Optional[bool] = None
    prefetch_factor: Optional[int] = 2
    persistent_workers: bool = False
    io_timeout_s: float = 60.0


@dataclass
class EngineConfig:
    name: str = "ddp"  # ddp | deepspeed
    precision: str = "auto"
    compile: bool = False
    channels_last: Optional[bool] = None  # null: on for convolutional backbones on CUDA (engine.base.use_channels_last)
    zero_stage: Optional[int] = None  # deepspeed only
    config: Dict[str, Any] = field(default_factory=dict)  # deepspeed only: merged into the generated config


@dataclass
class WandbConfig:
    mode: str = "offline"
    project: str = "eigtrain"
    entity: Optional[str] = None


@dataclass
class LoggingConfig:
    progress: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)


# ------------------------------------------------------------------- groups with per-option keys

@dataclass
class OptimBase:
    name: str = MISSING
    lr: float = 0.1
    weight_decay: float = 0.0
    exclude_bias_and_norm: bool = False
    schedule: str = "cosine"  # cosine | constant
    warmup_steps: int = 0
    final_lr: float = 0.0
    grad_clip: Optional[float] = None


@dataclass
class SGDConfig(OptimBase):
    name: str = "sgd"
    momentum: float = 0.9
    nesterov: bool = False


@dataclass
class LarsConfig(OptimBase):
    name: str = "lars"
    momentum: float = 0.9
    trust_coeff: float = 0.001


@dataclass
class AdamWConfig(OptimBase):
    name: str = "adamw"
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


OPTIM_SCHEMAS = {"sgd": SGDConfig, "lars": LarsConfig, "adamw": AdamWConfig}


@dataclass
class LocalLauncherConfig:
    name: str = "local"


@dataclass
class SlurmLauncherConfig:
    """Keys of launcher=slurm (eigtrain/launch/slurm.py; configs/launcher/slurm.yaml documents them)."""

    name: str = "slurm"
    job_name: str = "eigtrain"
    folder: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: int = 60
    nodes: int = 1
    tasks_per_node: Optional[int] = None
    gpus_per_node: int = 0
    gpu_binding: str = "node"  # node | task
    cpus_per_task: Optional[int] = None
    mem: Any = None  # GB, or a Slurm string
    mem_per_cpu: Any = 4  # GB, or a Slurm string; used when mem is null
    constraint: Optional[str] = None
    additional_parameters: Dict[str, Any] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)
    max_requeues: int = 3
    signal_delay_s: int = 120
    save_on_signal: bool = False
    wait: bool = False


LAUNCHER_SCHEMAS = {"local": LocalLauncherConfig, "slurm": SlurmLauncherConfig}


def objective_schema(name: str) -> type:
    """A dataclass of objective `name`'s keys, made from its class's `defaults` and the `options` every
    objective takes (reduction across ranks: auto | moments | gather; types from the values)."""
    from eigtrain.objectives import OBJECTIVES

    defaults = {**OBJECTIVES[name].defaults, **OBJECTIVES[name].options}
    return dataclasses.make_dataclass(
        f"{name}_objective", [("name", str, field(default=name))] + [(k, type(v), field(default=v)) for k, v in defaults.items()])


@dataclass
class MonitorConfig:
    """Online kNN monitor (eigtrain/monitor.py; train.yaml documents the keys)."""

    every: int = 0
    train_split: str = "train"
    val_split: str = "val"
    max_train_samples: int = 10000
    max_val_samples: int = 5000
    k: int = 20
    batch_size: int = 256


# ------------------------------------------------------------------------------------------- root

@dataclass
class TrainConfig:
    objective: Any = MISSING  # checked against objective_schema(objective.name)
    nesting: NestingConfig = field(default_factory=NestingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    optim: Any = MISSING  # checked against OPTIM_SCHEMAS[optim.name]
    launcher: Any = MISSING  # checked against LAUNCHER_SCHEMAS[launcher.name]
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    name: str = "default"
    run_dir: str = MISSING
    steps: int = 1000
    stop_after: Optional[int] = None
    batch_size: int = 256
    micro_batch_size: Optional[int] = None
    dim: int = 64
    seed: int = 0
    device: str = "auto"
    cpu_threads: Optional[int] = None
    checkpoint_every: int = 500
    keep_last: int = 3
    log_every: int = 10
    max_nonfinite_steps: int = 10
    dist_timeout_s: float = 600.0
    signal_check_every: int = 10  # steps between the ranks' agreement on a stop signal (a collective)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


# Keys that do not change what a sweep point trains -- where, how fast and how observably it runs, when this
# invocation stops -- and so never name its directory: changing one on a requeue resumes the point instead of
# restarting it from step 0. A key listed here covers its sub-keys (`logging` covers `logging.wandb.mode`).
# Every other key (objective, model, data content and order, optimizer, batch sizes, precision, seed, steps, ...)
# names the point.
NOT_RESULT_KEYS = (
    "run_dir", "name", "hydra", "launcher", "logging", "monitor",  # where it runs and what it reports
    "stop_after", "checkpoint_every", "keep_last", "log_every", "max_nonfinite_steps", "dist_timeout_s",
    "signal_check_every",
    "device", "cpu_threads", "engine.compile", "engine.channels_last",  # speed, not the result
    "data.num_workers", "data.pin_memory", "data.prefetch_factor", "data.persistent_workers", "data.io_timeout_s",
    "data.decode", "data.shard_index", "data.allow_pipe",
)


def names_point(key: str) -> bool:
    """Whether an override of `key` changes what is trained (and so names a sweep point's directory)."""
    key = key.lstrip("+~")
    return not any(key == k or key.startswith(k + ".") for k in NOT_RESULT_KEYS)


def sweep_point(overrides) -> str:
    """A multirun job's directory name: its own result-changing overrides, sorted (`optim.lr=0.05,seed=1`).

    The same point gives the same name on every submission, whatever NOT_RESULT_KEYS it also sets, so a requeued
    or re-run point resumes from its own checkpoints; different points never share one. Credentials in URL values
    never reach the name (eigtrain.redact).
    """
    kept = sorted(o for o in overrides if names_point(o.split("=")[0]))
    name = ",".join(_short(redact_url(o)) for o in kept) or "default"
    if len(name) > 160:  # file names are limited to 255 bytes
        name = f"{name[:140]}-{_digest(name)}"
    return name


def _short(override: str) -> str:
    """key=value with a path value as its last part plus a digest of the whole: data.root=digits-1a2b3c4d.
    Hydra's quotes are dropped first: `data.shards='X'` (how a brace pattern must be given) is the point X."""
    key, _, value = override.partition("=")
    value = _QUOTED.sub(lambda m: m.group(2), value)
    if "/" in value:
        value = f"{value.rstrip('/').rpartition('/')[2] or 'root'}-{_digest(value)[:8]}"
    return f"{key}={value}"


_QUOTED = re.compile(r"""(['"])(.*?)\1""")  # a quoted string of a Hydra override value


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def register() -> None:
    """Put the schema into Hydra's ConfigStore (train.yaml's defaults list names `train_schema`) and the
    resolvers the yaml files use."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
    OmegaConf.register_new_resolver("eigtrain.sweep_point", sweep_point, replace=True)
    # launcher=slurm: one CPU per DataLoader worker plus the training process
    OmegaConf.register_new_resolver("eigtrain.cpus_for_workers", lambda workers: int(workers) + 1, replace=True)


register()

_BY_NAME = {"optim": OPTIM_SCHEMAS, "launcher": LAUNCHER_SCHEMAS}


def _group_schema(group: str, name: Any) -> type:
    if group == "objective":
        from eigtrain.objectives import OBJECTIVES

        schemas = dict.fromkeys(OBJECTIVES)
    else:
        schemas = _BY_NAME[group]
    if name not in schemas:
        raise ConfigError(f"{group}.name={name!r} is not allowed; allowed: {', '.join(schemas)}")
    return objective_schema(name) if group == "objective" else schemas[name]


def check(cfg: DictConfig) -> None:
    """Raise ConfigError (one line, naming the key) unless `cfg` fits the schema.

    Hydra already applies `TrainConfig` while composing; this also covers configs built or changed in
    code, `+key=value` additions, and the groups whose keys depend on the option's name.
    """
    rest = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    for group in ("objective", "optim", "launcher"):
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            raise ConfigError(f"{group} must be a config group option, got {node!r}")
        _fits(_group_schema(group, node.get("name")), node, prefix=group)
        rest[group] = None
    _fits(TrainConfig, rest)


def _fits(schema: type, node: DictConfig, prefix: str = "") -> None:
    try:
        OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as error:
        raise ConfigError(describe(error, prefix)) from None


def describe(error: OmegaConfBaseException, prefix: str = "") -> str:
    """One line for an OmegaConf error: the full key, what went wrong and, for an unknown key, the
    allowed keys."""
    key = getattr(error, "full_key", None) or ""
    key = f"{prefix}.{key}" if prefix and key else key
    message = str(error).splitlines()[0] if str(error) else type(error).__name__
    if isinstance(error, (ConfigKeyError, ConfigAttributeError)) and ("not in" in message or "is not in struct" in message):
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
    if group in ("objective", "optim", "launcher") and isinstance(parent, DictConfig) and "name" in parent:
        try:
            schema = _group_schema(group, parent.name)
        except ConfigError:
            pass
    if dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    return [str(k) for k in parent.keys()] if isinstance(parent, DictConfig) else []
