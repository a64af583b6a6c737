"""eigtrain-rr's run: one distributed pass of Rayleigh-Ritz, then an ordered-embedding export; its usage and
configuration are eigtrain.export.rr_config (checked before this module, and torch, are imported)."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from eigtrain import dist as edist
from eigtrain.cli import asks_for_help, one_line_errors
from eigtrain.export import embedding_files
from eigtrain.export.files import claimed_target, rr_manifest, save_export, warm_plot_imports
from eigtrain.export.moments import RRAccumulator
from eigtrain.export.prefixes import cut_errors, cuts_report, order_ties, tie_groups, undetermined_cuts
from eigtrain.export.raw_span import paper_convention, paper_from_export
from eigtrain.export.rayleigh_ritz import RRResult, centered, default_rtol, solve
from eigtrain.export.rr_config import USAGE, EncoderConfig, EncoderDataConfig, RRJobConfig, parse_args  # noqa: F401
from eigtrain.export.rr_lines import cuts_line, dimensions_line, ties_line, width_line
from eigtrain.runs.checksums import path_sha256
from eigtrain.runs.run_step import describe


def reduce_embeddings(path: str, pairs: bool, rank: int = 0, world: int = 1, block: int | None = None, folds: int = 0):
    """Accumulate this rank's contiguous share of the rows of stored pairs z1, z2 (an npz, a safetensors file or
    a directory of chunks, streamed); returns (acc, total rows). folds: also per fold, in contiguous blocks of rows
    (rows written next to each other, e.g. several augmentations of one image, are correlated: one fold keeps
    them together, so the folds' spread measures the noise of independent samples).
    block: rows read at a time (default: 512 MiB of float64 per view, at most 65,536 rows)."""
    chunks = embedding_files.open_chunks(path)
    d1, d2 = embedding_files.widths(chunks)
    block = block or max(256, min(65536, (1 << 26) // max(d1, d2)))
    if not pairs and d1 != d2:
        raise ValueError(
            f"{path}: z1 and z2 have widths {d1} and {d2}; one-encoder modes need equal widths, use mode=svd for two encoders"
        )
    acc = RRAccumulator(d1, pairs=pairs, dim_right=d2 if pairs else None, folds=folds)
    total = embedding_files.total_rows(chunks)
    row = total * rank // world  # the first of this rank's rows (iter_blocks' share)
    for z1, z2 in embedding_files.iter_blocks(chunks, rank, world, block):
        # the accumulator's fold count (fewer than asked at large d: moments.FOLDS_BYTES); the same on any rank count
        fold = torch.arange(row, row + len(z1)) * max(acc.fold_count, 1) // max(total, 1)
        acc.update(torch.from_numpy(z1), torch.from_numpy(z2), fold=fold)
        row += len(z1)
    return acc, embedding_files.total_rows(chunks)


def solve_both_conventions(acc: RRAccumulator, cfg: RRJobConfig):
    """The export's solve with the cuts the data determine (`with_cuts`); when it excludes the trivial mode, the
    paper's convention rides along (paper_*), treated the same way. With ridge > 0 the exact spectrum rides along
    too. extra: cuts (rr_prefixes.cuts_report), ties (the groups, when ties=variance reordered them)."""
    rtol = default_rtol(acc, cfg.mode) if cfg.rank_rtol is None else cfg.rank_rtol
    kwargs: dict[str, Any] = dict(center=cfg.center, ridge=cfg.ridge, rtol=rtol)
    main = solve(acc, cfg.mode, trivial=cfg.trivial, **kwargs)
    paper = paper_convention(main, acc, cfg.center, cfg.ridge, rtol)  # from main's solve: no second eigh
    result = with_cuts(main, acc, cfg, cfg.trivial)
    if cfg.ridge > 0:  # a regularized solve never stands alone: the sample moments' own spectrum beside it
        exact = solve(acc, cfg.mode, trivial=cfg.trivial, **{**kwargs, "ridge": 0.0})
        result.extra["exact_spectrum"] = exact.eigenvalues
    if cfg.trivial == "exclude":
        if paper is not None and cfg.ties == "variance":  # the export's transform is reordered: not derivable from it
            values, transform = paper_from_export(main.eigenvalues, main.transform, main.mean)
            paper = RRResult(values, transform, torch.zeros_like(main.mean), "generalized", acc.n)
        result.extra["paper_convention"] = paper or solve(acc, cfg.mode, trivial="keep", **kwargs)  # untested cuts
    return result


def with_cuts(result, acc: RRAccumulator, cfg: RRJobConfig, trivial: str):
    """The result with extra["cuts"] (which cuts its data determine) and, when ties=variance, its undetermined
    groups reordered by variance (extra["ties"]); extra["spectrum"] keeps the eigenvalues in the solve's order."""
    center = centered(cfg.mode, cfg.center, trivial)
    errors = cut_errors(result, acc)
    result.extra["spectrum"] = result.eigenvalues
    result.extra["cuts"] = cuts_report(
        errors, acc.fold_sizes if errors is not None else None, result.transform.shape[1]
    )
    result.extra["ties"] = None
    if cfg.ties == "variance" and errors is not None:
        groups = tie_groups(undetermined_cuts(errors), len(errors))
        spectrum, cuts = result.extra["spectrum"], result.extra["cuts"]
        result = order_ties(result, acc, groups, center)
        result.extra.update(spectrum=spectrum, cuts=cuts, ties={"order": "variance", "groups": groups})
    return result


def untested_reason(cfg: RRJobConfig, acc: RRAccumulator) -> str:
    if cfg.mode != "generalized":
        return f"mode={cfg.mode} is not the generalized solve"
    if acc.fold_sizes is None:
        return "two encoders" if acc.pairs else "no folds kept"
    return f"a fold of the {cfg.folds} holds fewer than 2 samples"


def select_device(cfg: RRJobConfig, env) -> torch.device:
    """cfg.device, with `auto` = this rank's GPU when there is one (bound as the trainer binds it)."""
    return edist.select_device(env, cfg.device)


def run(cfg: RRJobConfig) -> dict:
    env = edist.resolve_env()
    # The backend follows the device (NCCL whenever CUDA is visible failed on embeddings= and device=cpu)
    device = torch.device("cpu") if cfg.embeddings else select_device(cfg, env)
    edist.init_distributed(env, backend=edist.backend_for(device))
    target = cfg.out or (cfg.run_dir and Path(cfg.run_dir) / "rr")
    with claimed_target(target, cfg.overwrite, env.rank):  # before any work: never replace what it did not write
        return _solve_and_save(cfg, env, device)


def _reduce(cfg: RRJobConfig, env, device: torch.device, pairs: bool) -> tuple:
    """The moments of cfg's source: (accumulator, the sample count expected, the source's description, out)."""
    if cfg.embeddings:
        path = Path(cfg.embeddings)
        with ThreadPoolExecutor(1) as pool:  # the files' hash beside the moments' BLAS (hashlib frees the GIL), or
            # taken from eigtrain-rr's hash_ahead (started before torch was imported: eigtrain.commands.rr)
            digest = pool.submit(path_sha256, path) if env.rank == 0 else None
            acc, expected = reduce_embeddings(cfg.embeddings, pairs, env.rank, env.world_size, folds=cfg.folds)
            sha256 = None if digest is None else digest.result()
        source: dict[str, Any] = {"kind": "embeddings", "path": str(path.resolve()), "sha256": sha256}
        assert cfg.out is not None  # RRJobConfig requires out= with embeddings= and encoder=
        return acc, expected, source, Path(cfg.out)
    if cfg.encoder.name:
        from eigtrain.export.external_views import reduce_external

        acc, expected, source = reduce_external(cfg, env, device)
        assert cfg.out is not None  # RRJobConfig requires out= with embeddings= and encoder=
        return acc, expected, source, Path(cfg.out)
    from eigtrain.export.embed import reduce_encoder  # needs the trainer's checkpoint loading

    acc, expected, source, default_out = reduce_encoder(cfg, env, pairs, device)
    return acc, expected, source, Path(cfg.out or default_out)


def _solve_and_save(cfg: RRJobConfig, env, device: torch.device) -> dict:
    if env.rank == 0:  # the decay plot's imports load while the moments' BLAS runs (1-1.5 s of a short pass)
        threading.Thread(target=warm_plot_imports, daemon=True).start()
    # embedding files' moments are numpy/scipy's products (their own BLAS threads): torch's pool, waking for the small
    # steps between them, spun beside those threads (1.3 s of CPU at d = 2,048), so one torch thread. An encoder's
    # forward passes keep torch's threads, and so does the solve (its d x d passes: 14 s slower on one at 8,192)
    with edist.torch_threads(1 if device.type == "cpu" and cfg.embeddings else None):
        acc, expected, source, out = _reduce(cfg, env, device, pairs=cfg.mode == "svd")
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
        shown = ", ".join(f"{v:.4f}" for v in summary["eigenvalues"][:8])
        print(f"eigtrain-rr: {acc.n} samples, mode {cfg.mode}; eigenvalues {shown}{' ...' if width > 8 else ''}")
        if source.get("kind") == "checkpoint":  # which step of the run: an unfinished run's checkpoint says so
            print(f"eigtrain-rr: {source['run_dir']} at {describe(source['path'], source['step'], source['steps'])}")
        print(dimensions_line(result.dims))
        if warning := width_line(int(result.transform.shape[0]), acc.n):
            print(warning)
        if cfg.ridge > 0:
            print(
                f"eigtrain-rr: ridge={cfg.ridge:g} regularizes the Gram (not the exact solve); exact spectrum in the manifest"
            )
        if result.extra["cuts"]:
            print(cuts_line(result.extra["cuts"], width))
        elif cfg.folds:
            print(f"eigtrain-rr: which cuts the data determine was not tested ({untested_reason(cfg, acc)})")
        if result.extra["ties"]:
            print(ties_line(result.extra["ties"]))
        print(f"eigtrain-rr: export {out} ({out / 'manifest.json'})")
        spectrum_to_wandb(source, result.eigenvalues.tolist())
    edist.barrier()
    return summary


def spectrum_to_wandb(source: dict, eigenvalues: list[float]) -> None:
    """The spectrum in the run's wandb run (eigtrain.export.rr_wandb); a failure there loses nothing: one line."""
    if source.get("kind") != "checkpoint":  # only a run has a wandb run (and its readers cost 1.8 s to import)
        return
    from eigtrain.export.rr_wandb import log_rr_spectrum

    try:
        if log_rr_spectrum(source, eigenvalues):
            print("eigtrain-rr: the spectrum is logged to the run's wandb run (rr/spectrum)")
    except Exception as exn:  # noqa: BLE001 - the export is written; wandb is a view of it
        print(
            f"eigtrain-rr: the spectrum was not logged to wandb ({type(exn).__name__}: {exn}); the export is complete"
        )


def main(argv: list[str] | None = None, config: RRJobConfig | None = None) -> int:
    """eigtrain-rr with the command line argv (None: sys.argv's); config: argv already parsed (eigtrain.commands)."""
    args = sys.argv[1:] if argv is None else argv
    if config is None and asks_for_help(args, USAGE):
        return 0
    try:
        return one_line_errors("eigtrain-rr", lambda: run(config or parse_args(args)))
    finally:
        edist.destroy()


if __name__ == "__main__":
    sys.exit(main())
