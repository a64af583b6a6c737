"""Run a trained encoder over a split of its shards: positive pairs for Rayleigh-Ritz, plain embeddings for
evaluation. Every sample is read exactly once across ranks and workers (ShardStream one_pass)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from .checkpoint import EXPORT_NAME, latest_checkpoint, load_encoder
from .data import ShardStream, build_augment, read_index
from .data.augment import NORMALIZATION
from .export import file_sha256
from .rayleigh_ritz import RRAccumulator


@dataclass
class TrainedRun:
    run_dir: Path
    cfg: DictConfig
    encoder: torch.nn.Module
    weights: Path  # model.safetensors or a checkpoint directory

    @property
    def pairs(self) -> bool:
        return self.cfg.data.mode == "pairs"


def open_run(run_dir: str | None = None, checkpoint: str | None = None, device: str = "cpu") -> TrainedRun:
    """The run's encoder: its final export, or a given checkpoint (run_dir/checkpoints/step-N)."""
    if checkpoint:
        step = Path(checkpoint)
        if not step.is_dir():
            raise FileNotFoundError(f"checkpoint directory {step} does not exist")
        run = Path(run_dir) if run_dir else step.parent.parent
    else:
        run = Path(run_dir)
        if not (run / "config.yaml").exists():
            raise FileNotFoundError(f"{run} is not a training run directory (no config.yaml)")
        step = None if (run / EXPORT_NAME).exists() else latest_checkpoint(run / "checkpoints")
        if step is None and not (run / EXPORT_NAME).exists():
            raise FileNotFoundError(f"{run} has neither {EXPORT_NAME} nor a complete checkpoint")
    encoder = load_encoder(run, step).to(device)
    return TrainedRun(run, OmegaConf.load(run / "config.yaml"), encoder, step or run / EXPORT_NAME)


def weights_sha256(path: Path) -> str:
    """Hash of a weights file, or of every file of a checkpoint directory (names and content hashes)."""
    if path.is_file():
        return file_sha256(path)
    digest = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(f"{f.relative_to(path)}:{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def normalization(data: DictConfig) -> dict:
    """The mean/std the run trained with (its config, else its augmentation preset's defaults)."""
    mean, std = NORMALIZATION[data.augment]
    return {"mean": tuple(data.mean) if data.mean else mean, "std": tuple(data.std) if data.std else std}


def _stream(run: TrainedRun, split: str, batch_size: int, num_workers: int, rank: int, world: int) -> ShardStream:
    data = run.cfg.data
    shards = len(read_index(data.root).shards(split))
    workers = min(num_workers, shards // world)  # each worker reads whole shards of its own; 0 = in-process
    return ShardStream(data.root, split=split, batch_size=batch_size, rank=rank, world_size=world,
                       num_workers=workers, seed=run.cfg.seed, mode=data.mode, image_size=data.image_size,
                       one_pass=True, max_corrupt=data.max_corrupt)


@torch.no_grad()
def reduce_pairs(run: TrainedRun, split: str, batch_size: int, num_workers: int, rank: int, world: int,
                 device: str = "cpu", seed: int = 0) -> tuple[RRAccumulator, int]:
    """Accumulate (Psi(a), Psi(a+)) over augmented views (or (Phi(x), Psi(a)) for pairs) of this rank's share."""
    data = run.cfg.data
    stream = _stream(run, split, batch_size, num_workers, rank, world)
    augment = build_augment(data.augment, image_size=data.view_size, **normalization(data)).to(device)
    generator = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    dim = run.cfg.dim
    acc = RRAccumulator(dim, pairs=run.pairs, device=device)
    for batch in stream:
        if run.pairs:
            x = augment.view(batch["x"].to(device), generator, 0)
            a = batch["a"].to(device)
            a = augment.view(a, generator, 1) if a.dtype == torch.uint8 else a
            acc.update(*run.encoder(x, a))
        else:
            v1, v2 = augment(batch["image"].to(device), generator=generator)
            z = run.encoder(torch.cat([v1, v2]))
            acc.update(*z.chunk(2))
    return acc, read_index(data.root).num_samples(split)


@torch.no_grad()
def embed_split(run: TrainedRun, split: str, batch_size: int = 512, num_workers: int = 1, device: str = "cpu"):
    """Un-augmented embeddings z = encoder(x) of a whole split (one process), with labels and keys."""
    data = run.cfg.data
    stream = _stream(run, split, batch_size, num_workers, 0, 1)
    normalize = build_augment("none", image_size=data.view_size, **normalization(data)).to(device)
    zs, labels, keys = [], [], []
    for batch in stream:
        images = batch["x"] if run.pairs else batch["image"]
        x = normalize.view(images.to(device), None, 0)
        zs.append((run.encoder.phi if run.pairs else run.encoder)(x).float().cpu())
        labels.append(batch["label"])
        keys += batch["key"]
    order = sorted(range(len(keys)), key=keys.__getitem__)  # worker interleaving is not part of the result
    return torch.cat(zs)[order], torch.cat(labels)[order]


def reduce_encoder(cfg, env, pairs: bool):
    """The eigtrain-rr path for a run directory or checkpoint (see eigtrain.rr_job)."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device
    if device == "cuda":
        device = f"cuda:{env.local_rank}"
    run = open_run(cfg.run_dir, cfg.checkpoint, device)
    if run.pairs != pairs:
        raise ValueError(f"mode={cfg.mode!r} does not fit this run: use mode=svd for a pairs run (two encoders), another mode for views")
    acc, expected = reduce_pairs(run, cfg.split, cfg.batch_size, cfg.num_workers, env.rank, env.world_size, device)
    source = {"kind": "checkpoint", "run_dir": str(run.run_dir.resolve()), "path": str(Path(run.weights).resolve()),
              "sha256": weights_sha256(Path(run.weights))}
    return acc, expected, source, run.run_dir / "rr"
