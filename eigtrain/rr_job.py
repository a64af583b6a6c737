"""eigtrain-rr: one distributed pass of Rayleigh-Ritz, then an ordered-embedding export.

    eigtrain-rr run_dir=DIR [split=train] [mode=generalized] [trivial=exclude|keep] [center=false]
                [shrinkage=oas|none] [ridge=0] [out=DIR] [overwrite=false]
    eigtrain-rr checkpoint=DIR/step-N ...
    eigtrain-rr run_dir=DIR split=val [data.val_shards=PATTERN]   # a data.shards run: its held-out shards
    eigtrain-rr embeddings=FILE.npz out=DIR      # black-box embeddings: arrays z1, z2 (N x d) of positive pairs
    eigtrain-rr embeddings=DIR out=DIR           # the same, streamed from chunks (see eigtrain.embedding_files)
    eigtrain-rr encoder=timm:NAME [encoder.checkpoint=FILE] data.root=DIR|data.shards=PATTERN data.augment=imagenet out=DIR
    eigtrain-rr encoder=module:pkg.mod:factory [encoder.kwargs.KEY=VALUE] data.root=DIR ... out=DIR

Every sample is read exactly once across ranks and workers, accumulated in float64, reduced once at the
end, and the total count is checked against the shard index (or the files' row count). Runs as one
process, under torchrun, or on Slurm with the project's launcher (the rank comes from eigtrain.dist).
The export directory appears only when complete (written beside it, then renamed). `out=` must be new, empty, or
(with overwrite=true) an earlier eigtrain-rr export; anything else there is refused and left untouched.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import dist as edist
from . import embedding_files
from .cli import compose_dataclass
from .data.augment import PRESETS
from .export import check_export_target, file_sha256, files_sha256, rr_manifest, save_export
from .probes import dims_for
from .rayleigh_ritz import MODES, TRIVIAL, RRAccumulator, centered, solve
from .redact import redact_url
from .rr_prefixes import agreement_curve, order_ties, prefix_reproducibility, tie_groups
from .shrinkage import SHRINKAGE


@dataclass
class EncoderConfig:
    name: str | None = None  # timm:NAME or module:pkg.mod:factory (`encoder=...` on the command line)
    checkpoint: str | None = None  # local weights (.safetensors or a torch state dict); never downloaded
    kwargs: dict[str, Any] = field(default_factory=dict)  # to timm.create_model or the factory


@dataclass
class DataConfig:
    """Image shards for encoder=: the augmentation preset defines the positive pairs. With run_dir= /
    checkpoint=, shards, val_shards and shard_index replace the run's saved ones, and allow_pipe=true lets a
    saved pipe: source run (eigtrain.data.pipe_trust)."""

    root: str | None = None  # eigtrain shards (index.json): the count is checked against the index
    shards: Any = None  # webdataset shard pattern(s)/URL(s) without an eigtrain index
    val_shards: Any = None  # held-out shards: split=val
    allow_pipe: bool = False  # run pipe: sources read back from a run's saved config.yaml
    augment: str = "imagenet"
    image_size: int | None = None  # loader resize (needed when the shards do not say, e.g. foreign shards)
    image_fit: str = "cover"  # cover: resize + center crop; whole: the augmentation crops from the whole image
    view_size: int | None = None  # size of the augmented views (default: image_size)
    mean: list[float] | None = None  # normalization (default: the preset's)
    std: list[float] | None = None
    max_corrupt: int = 0  # a skipped sample would break the exact count: none by default
    image_key: str | None = None  # foreign shards: member name(s) of the image (default jpg;jpeg;png;webp)
    label_key: str | None = None  # foreign shards: not needed for Rayleigh-Ritz
    shard_index: str | None = None  # foreign shards: a wids index with the sample counts
    cache_dir: str | None = None  # foreign shards: where a scan's sample counts are cached
    io_timeout_s: float = 60.0  # foreign shards: the most any read of a remote shard may wait


@dataclass
class RRJobConfig:
    run_dir: str | None = None
    checkpoint: str | None = None
    embeddings: str | None = None
    out: str | None = None
    overwrite: bool = False  # replace an earlier eigtrain-rr export at out= (anything else there is refused)
    mode: str = "generalized"
    trivial: str = "exclude"  # exclude: the constant mode is exported apart, features follow it; keep: the paper's
    center: bool = False
    ridge: float = 0.0  # > 0 (with shrinkage=none): regularize the Gram, every dimension kept, instead of its range
    shrinkage: str = "oas"  # oas: the Gram shrunk before whitening, generalized mode (eigtrain.shrinkage) | none
    rank_rtol: float = 1e-10  # the numerical range: Gram eigenvalues above rank_rtol * the largest
    halves: bool = True  # also solve on two halves of the data: how far each prefix is determined (3x the moments)
    tie_agreement: float = 0.95  # halves agreeing below it on a prefix: a group ordered by variance (0: off)
    split: str = "train"
    batch_size: int = 512
    num_workers: int = 2
    device: str = "auto"
    seed: int = 0  # augmentation seed (each sample's views are a function of it and the sample's key)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    data: DataConfig = field(default_factory=DataConfig)

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
        if not 0 <= self.tie_agreement <= 1:
            raise ValueError(f"tie_agreement={self.tie_agreement} must lie in [0, 1] (0: no tie ordering)")
        if self.shrinkage not in SHRINKAGE:
            raise ValueError(f"shrinkage={self.shrinkage!r} is unknown; allowed: {', '.join(SHRINKAGE)}")
        if self.ridge > 0 and self.shrinkage != "none":
            raise ValueError(f"ridge= and shrinkage={self.shrinkage} both regularize the Gram: give shrinkage=none")
        if not 0 < self.rank_rtol < 1:
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
            if self.data.augment not in PRESETS:
                raise ValueError(f"data.augment={self.data.augment!r} is unknown; allowed: {', '.join(PRESETS)}")
            if self.mode == "svd":
                raise ValueError("encoder= runs one model on two views; mode=svd is for two encoders")
        return self


def parse_args(argv: list[str]) -> RRJobConfig:
    # `encoder=timm:NAME` names the model while `encoder.checkpoint=...` sets its fields: the name is encoder.name
    argv = ["encoder.name=" + a.partition("=")[2] if a.startswith("encoder=") else a for a in argv]
    return compose_dataclass(RRJobConfig, argv).validate()


def reduce_embeddings(path: str, pairs: bool, rank: int = 0, world: int = 1, block: int = 65536, halves=False):
    """Accumulate this rank's contiguous share of the rows of stored pairs z1, z2 (an npz, a safetensors file or
    a directory of chunks, streamed); returns (acc, total rows). halves: also per half (by the global row's parity)."""
    chunks = embedding_files.open_chunks(path)
    d1, d2 = embedding_files.widths(chunks)
    if not pairs and d1 != d2:
        raise ValueError(
            f"{path}: z1 and z2 have widths {d1} and {d2}; one-encoder modes need equal widths, use mode=svd for two encoders"
        )
    acc = RRAccumulator(d1, pairs=pairs, dim_right=d2 if pairs else None, halves=halves)
    row = embedding_files.total_rows(chunks) * rank // world  # the first of this rank's rows (iter_blocks' share)
    for z1, z2 in embedding_files.iter_blocks(chunks, rank, world, block):
        acc.update(torch.from_numpy(z1), torch.from_numpy(z2), half=torch.arange(row, row + len(z1)) % 2 == 1)
        row += len(z1)
    return acc, embedding_files.total_rows(chunks)


def solve_both_conventions(acc: RRAccumulator, cfg: RRJobConfig):
    """The export's solve, its ties ordered (`order_ties_of`); when it excludes the trivial mode, the paper's
    convention rides along (paper_*), its ties ordered the same way. extra: reproducibility, halves_n, ties."""
    kwargs = dict(center=cfg.center, ridge=cfg.ridge, rtol=cfg.rank_rtol, shrinkage=cfg.shrinkage)
    solved = solve(acc, cfg.mode, trivial=cfg.trivial, **kwargs)
    curve = agreement_curve(acc, cfg.mode, trivial=cfg.trivial, **kwargs)
    result, groups = order_ties_of(solved, acc, cfg, cfg.trivial, curve)
    result.extra["spectrum"] = solved.eigenvalues  # the eigenvalues themselves, descending (before tie ordering)
    width = result.transform.shape[1]
    result.extra["reproducibility"] = prefix_reproducibility(
        curve, sorted({*range(1, min(width, 8) + 1), *dims_for(width)})
    )
    result.extra["halves_n"] = [h.n for h in acc.halves] if curve is not None else None
    result.extra["ties"] = None if groups is None else {"agreement_below": cfg.tie_agreement, "groups": groups}
    if cfg.trivial == "exclude":
        paper = solve(acc, cfg.mode, trivial="keep", **kwargs)
        if groups is not None:  # the paper convention's own halves, only when their groups are wanted
            paper, result.extra["ties"]["paper_groups"] = order_ties_of(
                paper, acc, cfg, "keep", agreement_curve(acc, cfg.mode, trivial="keep", **kwargs)
            )
        result.extra["paper_convention"] = paper
    return result


def order_ties_of(result, acc: RRAccumulator, cfg: RRJobConfig, trivial: str, curve):
    """(result with its tie groups ordered, the groups) for one convention, from the halves' agreement `curve`;
    groups is None where tie ordering does not apply (a paper mode or svd, no halves, tie_agreement=0)."""
    if curve is None or cfg.mode != "generalized" or cfg.tie_agreement == 0:
        return result, None
    groups = tie_groups(curve[: result.transform.shape[1]], cfg.tie_agreement)
    return order_ties(result, acc, groups, center=centered(cfg.mode, cfg.center, trivial)), groups


def dimensions_line(dims: dict) -> str:
    """One line on how the embedding's dimensions were spent (both sides for svd)."""
    sides = [("", dims)] + ([("a-side: ", dims["right"])] if "right" in dims else [])
    parts = [
        f"{p}{d['features']} ordered features from {d['dim']} dimensions ({d['dead']} dead, {d['dependent']} "
        f"dependent{', 1 spanning the constant' if d['constant'] else ''})"
        for p, d in sides
    ]
    return "eigtrain-rr: " + "; ".join(parts)


def reproducibility_line(overlaps: dict[int, float], halves: list[int], width: int) -> str:
    """One line on which prefixes two halves of the data agree on (docs/export.md), with the halves' sizes: halves
    not much larger than the number of features determine little, and their figures say so."""
    cells = ", ".join(f"k={k} {v:.3f}" for k, v in overlaps.items())  # 3 places: 0.948 is below a 0.95 cut
    return (
        f"eigtrain-rr: first-k features solved on two halves of the data ({halves[0]} and {halves[1]} samples, "
        f"{width} features) agree (1 = the same k features): {cells}; a k well below 1 cuts inside a group of "
        f"near-equal eigenvalues"
    )


def shrinkage_line(shrunk: dict, n: int) -> str:
    """One line on the Gram's shrinkage (eigtrain.shrinkage)."""
    return (
        f"eigtrain-rr: the Gram shrunk toward a multiple of the identity before whitening ({shrunk['method'].upper()} "
        f"from {n} samples: intensity {shrunk['intensity']:.4f}); shrinkage=none solves on the sample moments as they are"
    )


def ties_line(ties: dict) -> str:
    """One line on the groups the halves do not order, ordered by variance (rr_prefixes.order_ties)."""
    spans = ", ".join(f"{a}-{b}" for a, b in ties["groups"])
    are = "are groups" if len(ties["groups"]) > 1 else "are a group"
    return (
        f"eigtrain-rr: features {spans} {are} whose order two halves of the data do not determine "
        f"(agreement < {ties['agreement_below']:g}); each group is ordered by the embedding's variance (its principal "
        f"components within the group)"
    )


def select_device(cfg: RRJobConfig, env) -> torch.device:
    """cfg.device, with `auto` = this rank's GPU when there is one (bound as the trainer binds it)."""
    return edist.select_device(env, cfg.device)


def run(cfg: RRJobConfig) -> dict:
    env = edist.resolve_env()
    # The backend follows the device (NCCL whenever CUDA is visible failed on embeddings= and device=cpu)
    device = torch.device("cpu") if cfg.embeddings else select_device(cfg, env)
    edist.init_distributed(env, backend=edist.backend_for(device))
    pairs = cfg.mode == "svd"
    if cfg.out or cfg.run_dir:  # before any work: never replace what eigtrain-rr did not write
        check_export_target(Path(cfg.out or Path(cfg.run_dir) / "rr"), cfg.overwrite)
    if cfg.embeddings:
        acc, expected = reduce_embeddings(cfg.embeddings, pairs, env.rank, env.world_size, halves=cfg.halves)
        path = Path(cfg.embeddings)
        source = {
            "kind": "embeddings",
            "path": str(path.resolve()),
            "sha256": (files_sha256(path) if path.is_dir() else file_sha256(path)) if env.rank == 0 else None,
        }
        out = Path(cfg.out)
    elif cfg.encoder.name:
        from .embed import reduce_external

        acc, expected, source = reduce_external(cfg, env, device)
        out = Path(cfg.out)
    else:
        from .embed import reduce_encoder  # needs the trainer's checkpoint loading

        acc, expected, source, default_out = reduce_encoder(cfg, env, pairs, device)
        out = Path(cfg.out or default_out)
    acc.all_reduce()
    if acc.n != expected:
        raise RuntimeError(
            f"Rayleigh-Ritz saw {acc.n} samples but the source holds {expected}: samples were lost or duplicated"
        )
    result = solve_both_conventions(acc, cfg)
    width = result.transform.shape[1]
    summary = {
        "out": str(out),
        "n": acc.n,
        "mode": cfg.mode,
        "eigenvalues": [round(float(v), 6) for v in result.eigenvalues[:16]],
        **rr_manifest(result),
    }
    if env.rank == 0:
        save_export(
            result,
            out,
            {**source, "split": cfg.split if not cfg.embeddings else None, "center": cfg.center},
            overwrite=cfg.overwrite,
        )  # atomic
        print(json.dumps(summary, indent=1))
        print(dimensions_line(result.dims))
        if source.get("kind") == "checkpoint":  # which weights: the run's final ones, or which checkpoint step
            print(f"eigtrain-rr: weights from {source['path']}")
        if result.extra.get("shrinkage"):
            print(shrinkage_line(result.extra["shrinkage"], acc.n))
        if result.extra["reproducibility"]:
            print(reproducibility_line(result.extra["reproducibility"], result.extra["halves_n"], width))
        if result.extra["ties"] and result.extra["ties"]["groups"]:
            print(ties_line(result.extra["ties"]))
    edist.barrier()
    return summary


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
        run(cfg)
    except (ValueError, OSError, RuntimeError) as error:  # OSError: missing files, unreadable shards
        print(redact_url(f"eigtrain-rr: {error}"), file=sys.stderr)  # e.g. a corrupt sample's signed shard URL
        return 2
    finally:
        edist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
