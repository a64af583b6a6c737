"""The training config's dataclasses: every key, its type, its default and one line of doc (the trailing comment).

Groups whose keys depend on the option's `name` (objective, optim, launcher) have one dataclass per option:
OPTIM_SCHEMAS, LAUNCHER_SCHEMAS, and OBJECTIVE_SCHEMAS (eigtrain.schema.objectives).

A key with a fixed set of values has its `Literal` alias here (OmegaConf 2.3 cannot type a field by a Literal, so the
field is `str` and eigtrain.train.checks checks the value against the alias; tests/config/test_schema_leaf.py
checks each alias against the registry that uses the value).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

from omegaconf import MISSING

from eigtrain.schema.objectives import OBJECTIVE_SCHEMAS, ObjectiveBase

NestingMode = Literal["none", "joint", "sequential"]  # eigtrain.objectives.nesting.MODES
Backbone = Literal[
    "tiny_cnn", "resnet18", "resnet50", "vit_tiny", "vit_small", "vit_base", "mlp"
]  # eigtrain.models.BACKBONES
DataMode = Literal["views", "pairs"]  # eigtrain.data.stream.MODES
AugmentPreset = Literal["digits", "cifar", "imagenet", "grayscale", "none"]  # eigtrain.data.augment_recipes.PRESETS
ImageFit = Literal["cover", "whole"]  # eigtrain.data.decode.FITS
Decode = Literal["auto", "cpu", "cuda"]  # eigtrain.data.gpu_decode.DECODE_CHOICES
Engine = Literal["ddp", "deepspeed"]  # eigtrain.engine.ENGINES
Precision = Literal["auto", "fp32", "bf16"]  # eigtrain.engine.base.PRECISIONS
CompileMode = Literal[
    "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]  # COMPILE_MODES
ZeroStage = Literal[1, 2, 3]  # eigtrain.engine.deepspeed_zero.ZERO_STAGES
Schedule = Literal["cosine", "constant"]  # eigtrain.engine.optim.SCHEDULES
WandbMode = Literal["offline", "online", "disabled"]  # eigtrain.train.metrics_log.WANDB_MODES
Device = Literal["auto", "cpu", "cuda"]


@dataclass
class NestingConfig:
    mode: str = "none"  # none | joint (sum of the prefix losses, one masked pass) | sequential (stop-gradient)
    prefixes: Any = None  # all | mrl ({4, 8, ..., dim}) | a list of prefix lengths; null with mode none
    weights: Optional[List[float]] = None  # a weight per prefix; null = uniform


@dataclass
class ModelConfig:
    backbone: str = "tiny_cnn"  # tiny_cnn | mlp | resnet18 | resnet50 | vit_tiny | vit_small | vit_base | timm:NAME
    width: int = 32  # tiny_cnn: channels of the first block (2 * width features); mlp: hidden width
    depth: int = 4  # mlp only: hidden layers
    pool: int = 1  # tiny_cnn: side of the average pool's output grid (2 * width * pool**2 features; 1: global)
    cifar_stem: bool = False  # resnet only: 3x3 stride-1 first conv, no max-pool (32x32 images)
    patch_size: int = 16  # vit only: must divide the image size
    projector_hidden: int = 128  # width of the projector's hidden blocks (the paper's image runs: 2048)
    projector_layers: int = 1  # hidden Linear-BN-ReLU blocks before the linear output (0: the output layer only)
    projector_batch_norm: bool = True  # BatchNorm in the projector's hidden blocks
    sync_batch_norm: bool = False  # multi-GPU: BatchNorm statistics over the global batch (false: per GPU)
    context: Any = None  # pairs data: a dict of the psi encoder's keys that differ from phi's (null = same)
    timm_kwargs: Any = None  # timm backbones: more timm.create_model arguments, e.g. {depth: 2, embed_dim: 64}
    pretrained: Optional[str] = None  # initial backbone weights: a local file, or cache (timm's, already cached)


@dataclass
class DataConfig:
    root: Optional[str] = None  # eigtrain shard directory (index.json); or data.shards
    split: str = "train"  # the split trained on
    mode: str = "views"  # views (one image -> two augmented views) | pairs (stored (x, a) pairs)
    num_workers: int = 1  # DataLoader workers per rank (0: read in the training process)
    image_size: Any = None  # fixed-size resize/crop in the workers: N (N x N) or [H, W]; null = as stored
    view_size: Any = None  # augmented view size: N (N x N) or [H, W]; null = the decoded image size
    resampled: bool = False  # draw shards with replacement (no epochs)
    max_corrupt: int = 10  # unusable samples skipped with a warning before the run stops
    max_image_pixels: int = 89_478_485  # a stored image above this many pixels is unusable (a counted skip), undecoded
    augment: str = "digits"  # augmentation preset on the device: digits | cifar | imagenet | grayscale | none
    mean: Optional[List[float]] = None  # normalization; null = what model.pretrained's weights state, else the preset's
    std: Optional[List[float]] = None  # normalization, with mean; null = the weights', else the preset's
    write_if_missing: Optional[str] = None  # eigtrain-shards source written to `root` without index.json; null: fail
    shard_size: int = 1000  # samples per shard that write_if_missing writes
    shards: Any = None  # shards instead of root: brace pattern or URL list (local, file:, http(s), pipe:, s3:, gs:)
    val_shards: Any = None  # held-out shards of split 'val' (pattern or list, read like shards): eval, rr, monitor
    allow_pipe: bool = False  # eigtrain-eval/-rr command line: run pipe: sources read back from a saved config
    shard_index: Optional[str] = None  # wids index of the shards' sample counts; null: next to them, else counted
    image_key: Optional[str] = None  # with shards: image member name(s), e.g. jpg or "jpg;png"; null: jpg;jpeg;png;webp
    label_key: Optional[str] = None  # with shards: cls | json:FIELD (a field of the .json member) | null (no labels)
    x_key: Optional[str] = None  # with shards, pairs mode: member(s) of x; null: x.png;x.jpg;x.jpeg;x.webp
    a_key: Optional[str] = None  # with shards, pairs mode: member(s) of a (.npy: a vector); null: a.png;...;a.npy
    image_fit: str = "cover"  # with image_size: cover (resize + center crop) | whole (fitted and padded, crops use all)
    shuffle_block: int = 1000  # undecoded samples each worker shuffles together (seeded; resume stays exact)
    mix_shards: int = 8  # shards each worker reads side by side (shards written class by class give mixed batches)
    augment_compile: Optional[bool] = None  # the device augmentation as one compiled graph per view; null: on CUDA
    decode: str = "cpu"  # JPEG decoding: cpu (in the workers) | auto (nvJPEG when training on CUDA) | cuda
    pin_memory: Optional[bool] = None  # DataLoader pinned memory; null: on when training on CUDA
    prefetch_factor: Optional[int] = 2  # batches each worker prepares ahead
    persistent_workers: bool = False  # keep workers alive between iterations (training is one endless iteration)
    io_timeout_s: float = 60.0  # bound on every network open/read: an unreachable shard is an error, never a hang

    def __post_init__(self) -> None:  # one form from here on: [H, W]
        self.image_size = image_size_value("data.image_size", self.image_size)
        self.view_size = image_size_value("data.view_size", self.view_size)


def image_size_value(key: str, value: Any) -> Optional[List[int]]:
    """An image size as [H, W] (every command's rule: N means N x N; null stays null); a ValueError naming `key`."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():  # a command line's N (its Any fields arrive as text)
        value = int(value)
    pair = [value, value] if isinstance(value, int) else list(value) if isinstance(value, (list, tuple)) else []
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise ValueError(f"{key} must be a positive integer N (N x N) or [H, W], got {value!r}")
    return pair


@dataclass
class EngineConfig:
    name: str = "ddp"  # ddp (DistributedDataParallel) | deepspeed (ZeRO 1-3)
    precision: str = "auto"  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16; the objective is always fp32
    compile: bool = False  # torch.compile the encoder
    # auto: CUDA graphs where the step is launch-bound (ddp on CUDA, one micro-batch, views <= 64 px a side)
    compile_mode: str = (
        "auto"  # auto | default | reduce-overhead (CUDA graphs: ddp on CUDA, one micro-batch) | max-autotune
    )
    channels_last: Optional[bool] = None  # null: on for convolutional backbones on CUDA (engine.base.use_channels_last)
    deterministic: bool = False  # CUDA: cuDNN's deterministic kernels, no autotuning; needed for bit-identical resume
    zero_stage: Optional[int] = None  # deepspeed only: ZeRO stage 1 | 2 | 3
    config: Dict[str, Any] = field(default_factory=dict)  # deepspeed only: merged into the generated config


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled
    project: str = "eigtrain"  # wandb project
    entity: Optional[str] = None  # wandb entity (team); null: the account's default


@dataclass
class LoggingConfig:
    progress: bool = True  # rank-0 progress display (live on a terminal, plain lines in batch logs)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # optional wandb logging beside metrics.jsonl


@dataclass
class MonitorConfig:
    every: int = 0  # steps between kNN evaluations on rank 0 (0: off); also at the last step; logged as knn/<k>
    train_split: str = "train"  # labelled bank the kNN votes with (its first max_train_samples)
    val_split: str = "val"  # evaluated split (its first max_val_samples)
    max_train_samples: int = 10000  # samples of train_split embedded per evaluation
    max_val_samples: int = 5000  # samples of val_split embedded per evaluation
    k: int = 20  # neighbours (weighted cosine kNN, temperature 0.07)
    batch_size: int = 256  # embedding batch size


# ------------------------------------------------------------------- groups with per-option keys


@dataclass
class OptimBase:
    name: str = MISSING  # sgd | lars | adamw (OPTIM_SCHEMAS)
    lr: float = 0.1  # peak learning rate (after warmup)
    weight_decay: float = 0.0  # decoupled for adamw, L2 for sgd and lars
    exclude_bias_and_norm: bool = False  # no weight decay (nor LARS adaptation) on biases and normalization weights
    schedule: str = "cosine"  # cosine (decay to final_lr) | constant (after warmup)
    warmup_steps: int = 0  # linear warmup from 0
    final_lr: float = 0.0  # learning rate at the last step (cosine)
    grad_clip: Optional[float] = None  # max global gradient norm; null: no clipping


@dataclass
class SGDConfig(OptimBase):
    name: str = "sgd"  # SGD with momentum
    momentum: float = 0.9  # momentum factor
    nesterov: bool = False  # Nesterov momentum


@dataclass
class LarsConfig(OptimBase):
    name: str = "lars"  # timm's LARS
    momentum: float = 0.9  # momentum factor
    trust_coeff: float = 0.001  # LARS trust coefficient


@dataclass
class AdamWConfig(OptimBase):
    name: str = "adamw"  # AdamW (fused on CUDA)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # moment decay rates
    eps: float = 1e-8  # denominator term


OPTIM_SCHEMAS = {"sgd": SGDConfig, "lars": LarsConfig, "adamw": AdamWConfig}


@dataclass
class LocalLauncherConfig:
    name: str = "local"  # run in this process (one CPU/GPU process, or one rank under torchrun)


@dataclass
class SlurmLauncherConfig:
    """Keys of launcher=slurm (eigtrain/launch/slurm.py)."""

    name: str = "slurm"  # submit with submitit; one task per GPU; a multirun point is its own job
    job_name: str = "eigtrain"  # Slurm job name
    folder: Optional[str] = None  # submitit logs and pickles (slurm.yaml: run_dir/slurm)
    partition: Optional[str] = None  # Slurm partition; null: the site's default
    account: Optional[str] = None  # Slurm account
    qos: Optional[str] = None  # Slurm QOS
    time: int = 60  # time limit, minutes
    nodes: int = 1  # nodes
    tasks_per_node: Optional[int] = None  # null: gpus_per_node (at least 1)
    gpus_per_node: int = 0  # GPUs per node
    gpu_binding: str = "node"  # node: --gpus-per-node, a task uses the GPU at its local rank | task: --gpus-per-task=1
    cpus_per_task: Optional[int] = None  # null: data.num_workers + 1 (the loader workers and the training process)
    mem: Any = None  # per node: GB, or a Slurm string ("64G", "0" = whole node); null: mem_per_cpu
    mem_per_cpu: Any = 4  # GB (or a Slurm string) per CPU, used when mem is null
    constraint: Optional[str] = None  # Slurm --constraint
    additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option
    setup: List[str] = field(default_factory=list)  # shell lines before srun (module load ...)
    max_requeues: int = 3  # requeues after preemption or a time-limit signal
    signal_delay_s: int = 120  # USR2 this long before the time limit
    save_on_signal: bool = False  # save at the next step boundary on USR2/SIGTERM, then requeue
    wait: bool = False  # wait for the job and exit with its status


LAUNCHER_SCHEMAS = {"local": LocalLauncherConfig, "slurm": SlurmLauncherConfig}


def objective_schema(name: str) -> type[ObjectiveBase]:
    """The dataclass of objective `name`'s keys (eigtrain.schema.objectives)."""
    return OBJECTIVE_SCHEMAS[name]


# ------------------------------------------------------------------------------------------- root


@dataclass
class TrainConfig:
    objective: Any = MISSING  # the loss: configs/objective/NAME.yaml, keys OBJECTIVE_SCHEMAS[NAME]
    nesting: NestingConfig = field(default_factory=NestingConfig)  # prefix sets the loss is nested over
    model: ModelConfig = field(default_factory=ModelConfig)  # encoder: backbone + projector
    data: DataConfig = field(default_factory=DataConfig)  # shards and the streaming pipeline
    engine: EngineConfig = field(default_factory=EngineConfig)  # DDP or DeepSpeed, precision
    optim: Any = MISSING  # optimizer and schedule: configs/optim/NAME.yaml, keys OPTIM_SCHEMAS[NAME]
    launcher: Any = MISSING  # where it runs: configs/launcher/NAME.yaml, keys LAUNCHER_SCHEMAS[NAME]
    monitor: MonitorConfig = field(default_factory=MonitorConfig)  # online kNN monitor on rank 0; off by default
    name: str = "default"  # run name (default run directory)
    run_dir: str = MISSING  # train.yaml: runs/${name}; a restarted or requeued job resumes from its checkpoints
    steps: int = 1000  # optimizer steps; the learning-rate schedule spans them
    stop_after: Optional[int] = None  # end this invocation after this step (checkpoint, exit); resume later to steps
    batch_size: int = 256  # global batch over all ranks
    micro_batch_size: Optional[int] = None  # per rank per forward pass; null = batch_size / world size (no accum.)
    dim: int = 64  # embedding dimension d (projector output, objective dimension)
    seed: int = 0  # initial weights, data order, augmentation
    device: str = "auto"  # auto (cuda:LOCAL_RANK when a GPU is visible, else cpu) | cpu | cuda
    cpu_threads: Optional[int] = None  # torch intra-op threads per process (null: PyTorch's default; torchrun sets 1)
    checkpoint_every: int = 500  # steps; a checkpoint is also written at the end and on a stop signal
    keep_last: int = 3  # complete checkpoints kept
    new_lineage: bool = False  # resume despite a changed objective/model/data/schedule key (eigtrain.runs.lineage)
    log_every: int = 10  # steps between metrics.jsonl lines / progress updates
    max_nonfinite_steps: int = 10  # steps skipped for a non-finite loss or gradient before the run stops
    dist_timeout_s: float = 600.0  # a collective waiting longer (dead or stuck rank) ends the job with an error
    signal_check_every: int = 10  # steps between the ranks' agreement on a stop signal (a collective)
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # progress display and wandb
