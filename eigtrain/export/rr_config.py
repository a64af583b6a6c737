"""eigtrain-rr: one distributed pass of Rayleigh-Ritz, then an ordered-embedding export.

    eigtrain-rr run_dir=DIR [split=train] [mode=generalized] [trivial=exclude|keep] [center=false]
                [ties=eigenvalue|variance] [ridge=0] [out=DIR] [overwrite=false]
    eigtrain-rr checkpoint=DIR/step-N ...
    eigtrain-rr run_dir=DIR split=val [data.val_shards=PATTERN]   # a data.shards run: its held-out shards
    eigtrain-rr embeddings=FILE.npz out=DIR      # black-box embeddings: arrays z1, z2 (N x d) of positive pairs
    eigtrain-rr embeddings=DIR out=DIR           # the same, streamed from chunks (see eigtrain.export.embedding_files)
    eigtrain-rr encoder=timm:NAME [encoder.checkpoint=FILE] data.root=DIR|data.shards=PATTERN data.augment=imagenet out=DIR
    eigtrain-rr encoder=module:pkg.mod:factory [encoder.kwargs.KEY=VALUE] data.root=DIR ... out=DIR

Every sample is read exactly once across ranks and workers, accumulated in float64, reduced once at the
end, and the total count is checked against the shard index (or the files' row count). Runs as one
process, under torchrun, or on Slurm with the project's launcher (the rank comes from eigtrain.dist).
The export directory appears only when complete (written beside it, then renamed). `out=` must be new, empty, or
(with overwrite=true) an earlier eigtrain-rr export; anything else there is refused and left untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eigtrain.cli import compose_dataclass
from eigtrain.export.run_data import RunDataConfig
from eigtrain.schema.groups import image_size_value

USAGE = __doc__  # eigtrain-rr -h (eigtrain.commands): this module is its configuration, read before torch is imported
MODES = ("generalized", "paper-rq", "paper-vicreg", "paper-lora", "svd")  # the Rayleigh-Ritz problems (rayleigh_ritz)
TRIVIAL = ("exclude", "keep")  # the constant mode: exported apart, or kept in the solve (the paper's convention)
TIES = ("eigenvalue", "variance")  # inside an undetermined group: eigenvalue order, or (a departure) variance order


@dataclass
class EncoderConfig:
    name: str | None = None  # timm:NAME or module:pkg.mod:factory (`encoder=...` on the command line)
    checkpoint: str | None = None  # local weights (.safetensors or a torch state dict); never downloaded
    kwargs: dict[str, Any] = field(default_factory=dict)  # to timm.create_model or the factory


@dataclass
class EncoderDataConfig(RunDataConfig):
    """The data keys of eigtrain-rr: with run_dir= / checkpoint=, RunDataConfig's (shards, val_shards, shard_index
    replace the run's saved ones; allow_pipe); with encoder=, also the image shards and the augmentation preset whose
    two views are the positive pairs. Its defaults are the export's own, not the trainer's: no corrupt sample may be
    skipped (the exact count), and imagenet views for an external encoder."""

    root: str | None = None  # eigtrain shards (index.json): the count is checked against the index
    augment: str = "imagenet"  # the augmentation preset whose two views are the positive pairs
    image_size: Any = None  # loader resize, N (N x N) or [H, W] (needed when the shards do not say, e.g. foreign ones)
    image_fit: str = "cover"  # cover: resize + center crop; whole: the augmentation crops from the whole image
    view_size: Any = None  # size of the augmented views, N or [H, W] (default: image_size)
    mean: list[float] | None = None  # normalization (default: what encoder.checkpoint states, else the preset's)
    std: list[float] | None = None  # normalization, with mean (default: the checkpoint's, else the preset's)
    max_corrupt: int = 0  # a skipped sample would break the exact count: none by default
    image_key: str | None = None  # foreign shards: member name(s) of the image (default jpg;jpeg;png;webp)
    label_key: str | None = None  # foreign shards: not needed for Rayleigh-Ritz
    cache_dir: str | None = None  # foreign shards: where a scan's sample counts are cached
    io_timeout_s: float = 60.0  # foreign shards: the most any read of a remote shard may wait

    def __post_init__(self) -> None:  # eigtrain-train's rule: N or [H, W], one form ([H, W]) from here on
        self.image_size = image_size_value("data.image_size", self.image_size)
        self.view_size = image_size_value("data.view_size", self.view_size)


@dataclass
class RRJobConfig:
    run_dir: str | None = None  # a training run: its newest verified checkpoint, its data; the export goes in it
    checkpoint: str | None = None  # one checkpoint step directory of a run (instead of run_dir)
    embeddings: str | None = None  # stored embedding pairs (.npz with z1, z2, or a directory of chunks) instead
    out: str | None = None  # the export directory (run_dir/rr without it; needed for embeddings= and encoder=)
    overwrite: bool = False  # replace an earlier eigtrain-rr export at out= (anything else there is refused)
    mode: str = "generalized"  # the Rayleigh-Ritz problem: generalized | paper-rq | paper-vicreg | paper-lora | svd
    trivial: str = "exclude"  # exclude: the constant mode is exported apart, features follow it; keep: the paper's
    center: bool = False  # remove the constant (the features' means) without exporting it
    ridge: float = 0.0  # > 0: regularize the Gram (a departure from the exact solve; the exact spectrum rides along)
    rank_rtol: float | None = (
        None  # the range cut: Gram eigenvalues above rank_rtol * the largest (null: from the input's dtype)
    )
    folds: int = (
        8  # keep the moments of this many disjoint folds: which cuts the data determine (0: off; fewer at d > 4,096)
    )
    ties: str = "eigenvalue"  # variance: reorder each undetermined group by variance (a departure from RR's order)
    split: str = "train"  # the split whose pairs are streamed (train | val)
    batch_size: int = 512  # samples per batch, per rank
    num_workers: int = 2  # DataLoader workers per rank (0: read in the process)
    device: str = "auto"  # auto (cuda:LOCAL_RANK when a GPU is visible, else cpu) | cpu | cuda
    seed: int = 0  # augmentation seed (each sample's views are a function of it and the sample's key)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # an external encoder instead of a run
    data: EncoderDataConfig = field(default_factory=EncoderDataConfig)  # the image shards an encoder= or a run reads

    def validate(self) -> "RRJobConfig":
        sources = {
            "run_dir": self.run_dir,
            "checkpoint": self.checkpoint,
            "embeddings": self.embeddings,
            "encoder": self.encoder.name,
        }
        given = [k for k, v in sources.items() if v]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of run_dir=, checkpoint=, embeddings=, encoder= (got {given or 'none'})"
            )
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; allowed: {', '.join(MODES)}")
        if self.trivial not in TRIVIAL:
            raise ValueError(f"trivial={self.trivial!r} is unknown; allowed: {', '.join(TRIVIAL)}")
        if self.ties not in TIES:
            raise ValueError(f"ties={self.ties!r} is unknown; allowed: {', '.join(TIES)}")
        if self.folds == 1 or self.folds < 0:
            raise ValueError(f"folds={self.folds}: give 0 (no per-cut test) or at least 2")
        if self.ties == "variance" and not self.folds:
            raise ValueError("ties=variance reorders the groups the folds find undetermined: it needs folds >= 2")
        if self.ridge < 0:
            raise ValueError(f"ridge={self.ridge} must be >= 0")
        if self.rank_rtol is not None and not 0 < self.rank_rtol < 1:
            raise ValueError(f"rank_rtol={self.rank_rtol} must lie in (0, 1)")
        if (self.embeddings or self.encoder.name) and not self.out:
            raise ValueError(f"{given[0]}= needs out=DIR for the export")
        if self.embeddings and self.split != "train":  # the files are the data: there is no other split to read
            raise ValueError(
                f"split={self.split} does not apply to embeddings= (every row of the files is read); "
                "give the split's own files instead"
            )
        if self.encoder.name:
            if bool(self.data.root) == bool(self.data.shards):
                raise ValueError("encoder= needs exactly one of data.root=DIR (eigtrain shards) or data.shards=PATTERN")
            if self.data.shards and self.data.image_size is None:  # foreign shards say nothing of their size
                raise ValueError(
                    "encoder= with data.shards needs data.image_size (every image is brought to it before "
                    "the views are cut; e.g. data.image_size=224)"
                )
            from eigtrain.data.augment_recipes import PRESETS  # torch-free: checked before torch is imported

            if self.data.augment not in PRESETS:
                raise ValueError(f"data.augment={self.data.augment!r} is unknown; allowed: {', '.join(PRESETS)}")
            if self.mode == "svd":
                raise ValueError("encoder= runs one model on two views; mode=svd is for two encoders")
        return self


def parse_args(argv: list[str]) -> RRJobConfig:
    # `encoder=timm:NAME` names the model while `encoder.checkpoint=...` sets its fields: the name is encoder.name
    argv = ["encoder.name=" + a.partition("=")[2] if a.startswith("encoder=") else a for a in argv]
    return compose_dataclass(RRJobConfig, argv).validate()
