"""eigtrain-rr: one distributed pass of Rayleigh-Ritz, then an ordered-embedding export.

    eigtrain-rr run_dir=DIR [split=train] [mode=generalized] [center=false] [out=DIR]
    eigtrain-rr checkpoint=DIR/step-N ...
    eigtrain-rr embeddings=FILE.npz out=DIR      # black-box embeddings: arrays z1, z2 (N x d) of positive pairs

Every sample is read exactly once across ranks and workers, accumulated in float64, reduced once at the
end, and the total count is checked against the shard index (or the file's row count). Runs as one
process, under torchrun, or on Slurm with the project's launcher (the rank comes from eigtrain.dist).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from . import dist as edist
from .cli import parse_key_values
from .export import file_sha256, save_export
from .rayleigh_ritz import MODES, RRAccumulator, solve


@dataclass
class RRJobConfig:
    run_dir: str | None = None
    checkpoint: str | None = None
    embeddings: str | None = None
    out: str | None = None
    mode: str = "generalized"
    center: bool = False
    ridge: float = 0.0
    split: str = "train"
    batch_size: int = 512
    num_workers: int = 2
    device: str = "auto"

    def validate(self) -> "RRJobConfig":
        given = [k for k in ("run_dir", "checkpoint", "embeddings") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of run_dir=, checkpoint=, embeddings= (got {given or 'none'})")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is unknown; allowed: {', '.join(MODES)}")
        if self.embeddings and not self.out:
            raise ValueError("embeddings= needs out=DIR for the export")
        return self


def parse_args(argv: list[str]) -> RRJobConfig:
    return parse_key_values(RRJobConfig, argv).validate()


def reduce_embeddings(path: str, pairs: bool, rank: int = 0, world: int = 1, chunk: int = 65536):
    """Accumulate this rank's contiguous share of the rows of an npz with z1, z2; returns (acc, total rows)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"embeddings file {path} does not exist")
    with np.load(path) as data:
        missing = [k for k in ("z1", "z2") if k not in data]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}; expected z1, z2 of shape N x d")
        z1, z2 = data["z1"], data["z2"]
    if z1.ndim != 2 or z2.ndim != 2 or len(z1) != len(z2):
        raise ValueError(f"{path}: z1 {z1.shape} and z2 {z2.shape} must be N x d with the same N")
    if not pairs and z1.shape[1] != z2.shape[1]:
        raise ValueError(f"{path}: z1 and z2 have widths {z1.shape[1]} and {z2.shape[1]}; one-encoder modes need equal widths, use mode=svd for two encoders")
    acc = RRAccumulator(z1.shape[1], pairs=pairs, dim_right=z2.shape[1] if pairs else None)
    lo, hi = len(z1) * rank // world, len(z1) * (rank + 1) // world
    for s in range(lo, hi, chunk):
        e = min(s + chunk, hi)
        acc.update(torch.from_numpy(z1[s:e]), torch.from_numpy(z2[s:e]))
    return acc, len(z1)


def run(cfg: RRJobConfig) -> dict:
    env = edist.init_distributed()
    pairs = cfg.mode == "svd"
    if cfg.embeddings:
        acc, expected = reduce_embeddings(cfg.embeddings, pairs, env.rank, env.world_size)
        source = {"kind": "embeddings", "path": str(Path(cfg.embeddings).resolve()), "sha256": file_sha256(cfg.embeddings)}
        out = Path(cfg.out)
    else:
        from .embed import reduce_encoder  # needs the trainer's checkpoint loading

        acc, expected, source, default_out = reduce_encoder(cfg, env, pairs)
        out = Path(cfg.out or default_out)
    acc.all_reduce()
    if acc.n != expected:
        raise RuntimeError(f"Rayleigh-Ritz saw {acc.n} samples but the source holds {expected}: samples were lost or duplicated")
    result = solve(acc, cfg.mode, center=cfg.center, ridge=cfg.ridge)
    summary = {"out": str(out), "n": acc.n, "mode": cfg.mode, "eigenvalues": [round(float(v), 6) for v in result.eigenvalues[:16]]}
    if env.rank == 0:
        save_export(result, out, {**source, "split": cfg.split if not cfg.embeddings else None, "center": cfg.center})
        print(json.dumps(summary, indent=1))
    edist.barrier()
    return summary


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
        run(cfg)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        print(f"eigtrain-rr: {error}", file=sys.stderr)
        return 2
    finally:
        edist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
