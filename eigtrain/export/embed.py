"""Run a trained encoder over a split of its shards: positive pairs for Rayleigh-Ritz, plain embeddings for
evaluation. Every sample is read exactly once across ranks and workers (ShardStream one_pass)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn
from torch.nn import functional as F

from eigtrain.data import ShardStream, build_augment, read_index
from eigtrain.data.from_config import (
    DataConfigError,
    build_stream,
    data_root,
    split_shards,
    split_source,
    uses_shards,
)
from eigtrain.data.image_files import ImageFiles, list_images
from eigtrain.data.normalization import Normalization, as_trained
from eigtrain.data.pipe_trust import SOURCE_KEYS, check_saved_sources
from eigtrain.export.moments import RRAccumulator
from eigtrain.export.run_preprocess import normalization, sized
from eigtrain.export.run_weights import final_or_newest, read_newest
from eigtrain.models.encoder import PairEncoder
from eigtrain.redact import saved_value_usable
from eigtrain.runs.checkpoint import EXPORT_NAME, MODEL_INFO_NAME
from eigtrain.runs.checkpoint_read import read_json
from eigtrain.runs.checkpoint_verify import check_step
from eigtrain.runs.run_step import weights_record
from eigtrain.runs.saved_config import load_saved_config
from eigtrain.schema import DataConfig, typed, typed_option

NORM = ("augment", "mean", "std")  # a run's data keys its normalization follows when model.json has no record
RUN_KEYS = ("label_key",)  # data keys besides the sources that the command line may set for a run's shards


@dataclass
class TrainedRun:
    run_dir: Path
    cfg: DictConfig  # the saved config.yaml, for the records
    data: DataConfig  # its data group, with the command line's sources: what the streams take
    encoder: torch.nn.Module  # as its objective saw it (`objective_view`)
    weights: Path  # model.safetensors or a checkpoint directory
    normalization: Normalization  # the mean/std it trained with (its model.json's record: `as_trained`)
    given: frozenset[str] = frozenset()  # data keys the command line set (its sources are the user's own)
    allow_pipe: bool = False  # data.allow_pipe=true on the command line: saved pipe: sources may run
    output: str = "raw"  # raw | l2_normalized: what `encoder` returns (the export's input)
    weights_sha256: str | None = None  # of `weights` as loaded (read while the step was pinned against pruning)

    @property
    def pairs(self) -> bool:
        return self.data.mode == "pairs"


class L2Normalized(nn.Module):
    """An encoder whose outputs are l2-normalized per sample."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.encoder(x), dim=1)


def objective_view(encoder: nn.Module, cfg: DictConfig) -> tuple[nn.Module, str]:
    """The encoder as the run's objective saw it, and its output kind (raw | l2_normalized). An objective with
    normalize=full|prefix (SCL) fits its kernel on z / ||z||, so its eigenfunctions lie in the span of the
    normalized outputs, not of the raw ones: Rayleigh-Ritz and the evaluation work there (prefix: the whole
    vector's norm). On the claims benchmark RR at k = 4 went from 82.2 to 83.4 % (3 seeds, before the tie ordering;
    benchmarks/claims.md)."""
    normalize = vars(typed_option("objective", cfg.objective)).get("normalize")  # the LoRA family has the key
    if normalize in ("none", False, None):
        return encoder, "raw"
    if isinstance(encoder, PairEncoder):
        encoder.phi, encoder.psi = L2Normalized(encoder.phi), L2Normalized(encoder.psi)
        return encoder, "l2_normalized"
    return L2Normalized(encoder), "l2_normalized"


def open_run(
    run_dir: str | None = None,
    checkpoint: str | None = None,
    device: str = "cpu",
    data: Mapping[str, Any] | None = None,
) -> TrainedRun:
    """The run's encoder: its final export, or a given checkpoint (run_dir/checkpoints/step-N). `data`: the
    command line's data.shards / val_shards / shard_index (replacing the saved config's; None keeps it) and
    allow_pipe (see eigtrain.data.pipe_trust)."""
    step: Path | None
    if checkpoint:
        step = Path(checkpoint)
        if not step.is_dir():
            raise FileNotFoundError(f"checkpoint directory {step} does not exist")
        run = Path(run_dir) if run_dir else step.parent.parent
        check_step(step)  # complete, and its files as they were saved: else one line, nothing read
    else:
        assert run_dir is not None  # eigtrain-rr and eigtrain-eval require run_dir or checkpoint
        run = Path(run_dir)
        if not (run / "config.yaml").exists():
            raise FileNotFoundError(f"{run} is not a training run directory (no config.yaml)")
        step, _ = final_or_newest(run)
    cfg = load_saved_config(run / "config.yaml")  # plain YAML only: one line for a tag, never run
    encoder, weights_hash, step = read_newest(run, step, retry=checkpoint is None)
    encoder, output = objective_view(encoder.to(device), cfg)
    given = {k: v for k, v in (data or {}).items() if k in (*SOURCE_KEYS, *RUN_KEYS) and v is not None}
    if given.get("val_shards") is not None and not (given.get("shards") or cfg.data.shards):
        raise DataConfigError(  # it was ignored silently
            f"data.val_shards goes with data.shards: {run} was trained on data.root={cfg.data.root}, whose split 'val' "
            "is read without it"
        )
    cfg.data.update(given)
    allow_pipe = bool((data or {}).get("allow_pipe"))
    typed_data = typed(DataConfig, cfg.data)  # the one conversion of the saved data group
    norm = as_trained(read_json(run / MODEL_INFO_NAME).get("normalization"), *(getattr(typed_data, k) for k in NORM))
    weights = step or run / EXPORT_NAME
    return TrainedRun(run, cfg, typed_data, encoder, weights, norm, frozenset(given), allow_pipe, output, weights_hash)


def check_split(run: TrainedRun, split: str) -> str:
    """Where `split` of the run's data comes from (`split_source`), once it is known to exist (a run trained on
    data.shards has split 'val' only with data.val_shards) and to run no command read back from the run's
    config.yaml; a `DataConfigError` or `PipeNotAllowed` naming the key otherwise. Reads no shard."""
    data = run.data
    if uses_shards(data):
        key = split_shards(data, split)[0].removeprefix("data.")
        check_saved_sources(vars(data), (key, "shard_index"), run.given, run.allow_pipe, run.run_dir / "config.yaml")
        for saved in sorted({key, "shard_index"} - run.given):  # a URL saved without its credentials cannot be read
            saved_value_usable(getattr(data, saved), f"data.{saved}", run.run_dir / "config.yaml")
    return split_source(data, split)


def split_stream(
    run: TrainedRun, split: str, batch_size: int, num_workers: int, rank: int, world: int, device="cpu"
) -> ShardStream:
    """One pass over the run's data (data.root's split, or data.shards with the run's cached counts), in its channels
    and at its decoded size (`sized`: a raw image of another size is brought to it)."""
    check_split(run, split)
    shape = read_json(run.run_dir / MODEL_INFO_NAME)["input_shape"]
    data = sized(run.data, shape)
    if not uses_shards(data):  # each worker reads whole shards of its own; 0 = in-process
        num_workers = min(num_workers, len(read_index(data_root(data)).shards(split)) // world)
    return build_stream(
        data,
        batch_size=batch_size,
        rank=rank,
        world_size=world,
        seed=run.cfg.seed,
        device=device,
        cache_dir=run.run_dir / "data",
        split=split,
        num_workers=num_workers,
        one_pass=True,
        channels=int(shape[0]),
    )


def image_stream(run: TrainedRun, source: str, batch_size: int, rank: int, world: int) -> ImageFiles:
    """One pass over image files (a folder or a file list, `list_images`), brought to the run's input as its shards
    are: to data.image_size by data.image_fit, else to the encoder's input size; in the encoder's channels."""
    shape = read_json(run.run_dir / MODEL_INFO_NAME)["input_shape"]
    size, data = run.data.image_size or shape[1:], run.data
    return ImageFiles(list_images(source), int(shape[0]), size, data.image_fit, batch_size, rank, world,
                      data.max_image_pixels)  # fmt: skip


def sample_generators(keys: list[str], seed: int) -> list[torch.Generator]:
    """The augmentation RNG of each sample, a function of (seed, its key) only: its views are the same whatever
    batch, worker or rank reads it (any num_workers, batch_size or world size gives the same moments)."""
    digests = (hashlib.sha256(f"{seed}\n{key}".encode(errors="surrogateescape")).digest() for key in keys)
    return [torch.Generator().manual_seed(int.from_bytes(d[:8], "little") >> 1) for d in digests]


def autocast(device) -> torch.autocast:
    """bf16 autocast for the encoder on GPU; off on CPU (float32, and exact across runs)."""
    kind = torch.device(device).type
    return torch.autocast(kind, dtype=torch.bfloat16, enabled=kind == "cuda")


def key_folds(keys: list[str], folds: int) -> torch.Tensor:
    """Each sample's fold for rr_prefixes.cut_errors: its key's hash mod folds, so the folds are the same whatever
    the ranks and workers (a key that is not UTF-8 -- tar names are bytes -- hashes as its own bytes)."""
    digest = lambda key: hashlib.sha256(key.encode(errors="surrogateescape")).digest()  # noqa: E731
    return torch.tensor([int.from_bytes(digest(key)[:8], "big") % max(folds, 1) for key in keys])


@torch.no_grad()
def reduce_views(encode, stream: ShardStream, augment, acc: RRAccumulator, device, seed: int = 0) -> RRAccumulator:
    """Accumulate (encode(view 1), encode(view 2)) over every batch of a one-pass stream, float64."""
    for batch in stream:
        images, sizes = batch["image"].to(device, non_blocking=True), batch.get("size")  # size: image_fit="whole"
        v1, v2 = augment(images, generator=sample_generators(batch["key"], seed), sizes=sizes)
        with autocast(device):
            z = encode(torch.cat([v1, v2]))
        z1, z2 = z.float().chunk(2)
        acc.update(z1, z2, fold=key_folds(batch["key"], acc.fold_count))
    return acc


@torch.no_grad()
def reduce_pairs(
    run: TrainedRun,
    split: str,
    batch_size: int,
    num_workers: int,
    rank: int,
    world: int,
    device: str = "cpu",
    seed: int = 0,
    folds: int = 0,
) -> tuple[RRAccumulator, int]:
    """Accumulate (Psi(a), Psi(a+)) over augmented views (or (Phi(x), Psi(a)) for pairs) of this rank's share;
    folds: also per fold of the samples (`key_folds`)."""
    data = run.data
    stream = split_stream(run, split, batch_size, num_workers, rank, world, device)
    augment = build_augment(data.augment, image_size=data.view_size, **normalization(run)).to(device)
    acc = RRAccumulator(run.cfg.dim, pairs=run.pairs, device=device, folds=folds)
    if not run.pairs:
        return reduce_views(run.encoder, stream, augment, acc, device, seed), stream.num_samples
    for batch in stream:
        generator = sample_generators(batch["key"], seed)
        x = augment.view(batch["x"].to(device), generator, 0)
        a = batch["a"].to(device)
        a = augment.view(a, generator, 1) if a.dtype == torch.uint8 else a
        with autocast(device):
            z1, z2 = run.encoder(x, a)
        acc.update(z1.float(), z2.float(), fold=key_folds(batch["key"], acc.fold_count))
    return acc, stream.num_samples


@torch.no_grad()
def embed_split(run: TrainedRun, split: str, batch_size: int = 512, num_workers: int = 1, device: str = "cpu"):
    """Un-augmented embeddings z = encoder(x) of a whole split (one process), with labels and keys."""
    data = run.data
    stream = split_stream(run, split, batch_size, num_workers, 0, 1, device)
    normalize = build_augment("none", image_size=data.view_size, **normalization(run)).to(device)
    encoder = run.encoder.phi if run.pairs else run.encoder
    assert isinstance(encoder, nn.Module)
    zs, labels, keys = [], [], []
    for batch in stream:
        images = batch["x"] if run.pairs else batch["image"]
        x = normalize.view(images.to(device), None, 0, batch.get("size"))  # a padded batch: each valid region
        zs.append(encoder(x).float().cpu())
        labels.append(batch["label"])
        keys += batch["key"]
    order = sorted(range(len(keys)), key=keys.__getitem__)  # worker interleaving is not part of the result
    return torch.cat(zs)[order], torch.cat(labels)[order]


def reduce_encoder(cfg, env, pairs: bool, device):
    """The eigtrain-rr path for a run directory or checkpoint (see eigtrain.export.command)."""
    run = open_run(cfg.run_dir, cfg.checkpoint, device, data=command_line_data(cfg.data))
    data_source = check_split(run, cfg.split)
    used = weights_record(run)  # which step: eigtrain-rr prints it, the manifest records it
    if run.pairs != pairs:
        raise ValueError(
            f"mode={cfg.mode!r} does not fit this run: use mode=svd for a pairs run (two encoders), another mode for views"
        )
    acc, expected = reduce_pairs(
        run, cfg.split, cfg.batch_size, cfg.num_workers, env.rank, env.world_size, device, cfg.seed, cfg.folds
    )
    source = {
        "kind": "checkpoint",
        "run_dir": str(run.run_dir.resolve()),
        "path": str(Path(run.weights).resolve()),
        "sha256": run.weights_sha256,
        "data": data_source,
        "input": run.output,
        "step": used["step"],
        "steps": used["steps"],
    }
    return acc, expected, source, run.run_dir / "rr"


def command_line_data(data) -> dict[str, Any]:
    """The data keys of an eigtrain-rr / -eval command line that `open_run` applies to a saved run."""
    return {key: getattr(data, key) for key in (*SOURCE_KEYS, *RUN_KEYS, "allow_pipe")}
