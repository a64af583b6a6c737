"""eigtrain-embed: a trained run's ordered features (its Rayleigh-Ritz export applied to its encoder) of every sample
of a split, written in chunks a search index can load, resumable after a kill, on one process or under torchrun.

Output directory `out=`:
- ``rank-R-chunk-IIIII.safetensors``: tensor ``features`` (N x k, eigenvalue order, float16|float32) and the samples'
  keys as a JSON list in the file's metadata (``keys``), row i <-> key i. Each rank writes its own sequence; a chunk
  is written to a dot-prefixed temporary name and renamed, so it exists only when complete.
- ``manifest.json``: the settings (model, export, k, dtype, split, input view) written before the first chunk, then
  ``count``, every chunk's size and sha256, and ``complete: true`` once every rank is done (replaced atomically).
A rerun skips every sample whose key a complete chunk holds (any world size: coverage stays exact) and refuses
settings other than the manifest's, naming the key; a chunk of other settings, rows, width or dtype is refused
naming it (eigtrain.export.embed_chunks); a chunk removed from a complete output is embedded again. One writer per
out= (a lock on the directory); overwrite=true starts over, deleting only what eigtrain-embed wrote there. `read_embeddings` gives (keys, features[:, :k]) sorted by key.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eigtrain import dist as edist
from eigtrain import safe_files
from eigtrain.data import build_augment
from eigtrain.data.image_files import list_images
from eigtrain.export.embed import (
    TrainedRun,
    check_split,
    command_line_data,
    image_stream,
    normalization,
    open_run,
    split_stream,
)
from eigtrain.export.embed_chunks import (
    CHUNK,
    DTYPES,
    FORMAT,
    MANIFEST,
    changed_chunks,
    chunk_files,
    chunk_keys,
    chunk_records,
    remove_own,
    write_chunk,
    write_manifest,
)
from eigtrain.export.embed_config import USAGE, EmbedConfig  # noqa: F401  (checked before torch)
from eigtrain.export.embed_read import iter_embeddings
from eigtrain.export.files import TENSORS, OrderedHead, load_head
from eigtrain.export.manifests import read_tagged
from eigtrain.runs.checksums import file_sha256
from eigtrain.runs.lock import RunDirInUse, lock_directory, release_directory
from eigtrain.runs.output_dirs import EMBED_ENTRIES, OutputDirError, check_output_dir
from eigtrain.runs.provenance import export_provenance


def check_out(out: Path) -> dict | None:
    """Refuse (one line) an out= holding anything eigtrain-embed did not write; its manifest when it has one.
    Chunk names count as its own only beside its manifest (written before any chunk)."""
    chunks = (out / MANIFEST).is_file() and out.is_dir()
    own = {p.name for p in out.iterdir() if CHUNK.fullmatch(p.name)} if chunks else set()
    check_output_dir(out, own | EMBED_ENTRIES, "out")
    try:
        return read_tagged(out / MANIFEST, FORMAT, "eigtrain-embed")
    except ValueError as error:
        raise OutputDirError(f"out={out}: {error}: refusing to write there") from None


def load_export(cfg: EmbedConfig, run: TrainedRun) -> tuple[Path, OrderedHead, dict]:
    """The export applied to this run: (its directory, its head, its provenance); one line when it does not fit."""
    rr_dir = Path(cfg.rr) if cfg.rr else run.run_dir / "rr"
    if not (rr_dir / TENSORS).exists():
        hint = "give rr=DIR" if not cfg.rr else "check rr="
        raise FileNotFoundError(f"no Rayleigh-Ritz export at {rr_dir}: run eigtrain-rr run_dir={run.run_dir} or {hint}")
    head = load_head(rr_dir, dtype=torch.float64)
    if head.l2_normalize != (run.output == "l2_normalized"):
        raise ValueError(
            f"the Rayleigh-Ritz export {rr_dir} was solved on {'l2-normalized' if head.l2_normalize else 'raw'} "
            f"embeddings but this run's objective sees {run.output.replace('_', '-')} ones: run eigtrain-rr again"
        )
    provenance = export_provenance(rr_dir, run.weights, run.weights_sha256, cfg.allow_foreign_export)
    width = head.transform.shape[1]
    if cfg.k is not None and not 1 <= cfg.k <= width:
        raise ValueError(f"k={cfg.k} must lie in 1..{width}: the export {rr_dir} has {width} features")
    return rr_dir, head, provenance


def settings(cfg: EmbedConfig, run: TrainedRun, rr_dir: Path, head: OrderedHead, split: str) -> dict:
    """What the features are a function of: a rerun into the same out= must give the same ones."""
    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype={cfg.dtype!r} is not allowed; allowed: {', '.join(DTYPES)}")
    return {
        "model": {"run_dir": str(run.run_dir.resolve()), "weights": str(run.weights), "sha256": run.weights_sha256},
        "export": {"path": str(rr_dir.resolve()), "sha256": file_sha256(rr_dir / TENSORS)},
        "input": run.output,  # the view of the encoder the export was solved on (raw | l2_normalized)
        "k": cfg.k or int(head.transform.shape[1]),
        "dtype": cfg.dtype,
        "split": None if cfg.images else split,
        # where the data comes from (URLs without credentials)
        "data": f"images={Path(cfg.images).resolve()}" if cfg.images else check_split(run, split),
    }


def check_same(out: Path, old: dict, new: dict) -> None:
    differing = [key for key in new if old.get("settings", {}).get(key) != new[key]]
    if differing:
        raise ValueError(
            f"out={out} holds embeddings made with another {differing[0]} ({old['settings'].get(differing[0])!r}, "
            f"now {new[differing[0]]!r}): choose a new out= or rerun with the same settings"
        )


def resume_point(out: Path, rank: int, spec: dict) -> tuple[set[str], int]:
    """(the keys complete chunks hold, this rank's next chunk index). Every rank's keys: a rerun on another world
    size still embeds each sample exactly once."""
    done = chunk_files(out) if out.is_dir() else []
    for stale in out.glob(f".rank-{rank}-chunk-*.safetensors*.tmp"):  # this rank's, cut short by a kill
        stale.unlink()
    keys = {key for path in done for key in chunk_keys(path, spec)}  # each checked to be this output's
    return keys, 1 + max((int(m[2]) for p in done if (m := CHUNK.fullmatch(p.name)) and m[1] == str(rank)), default=-1)


def _take(value, rows: list[int]):
    """The rows `rows` of a batch field (a tensor, a list, or None)."""
    if value is None or isinstance(value, torch.Tensor):
        return None if value is None else value[rows]
    return [value[i] for i in rows]


@torch.no_grad()
def embed_share(
    cfg: EmbedConfig, run: TrainedRun, head: OrderedHead, spec: dict, env, device: str, out: Path, resume: tuple
) -> tuple[int, int]:
    """Embed this rank's share of the split but the keys in `resume` (`resume_point`): (samples in the split,
    chunks written now). Skipped samples are still read (the stream has no seek); a batch of skipped samples only is
    not encoded."""
    skip, index = resume
    data = run.data
    stream: Any = (
        image_stream(run, cfg.images, cfg.batch_size, env.rank, env.world_size)
        if cfg.images
        else split_stream(run, spec["split"], cfg.batch_size, cfg.num_workers, env.rank, env.world_size, device)
    )
    field = "x" if run.pairs and not cfg.images else "image"  # image files: the image encoder's input
    normalize = build_augment("none", image_size=data.view_size, **normalization(run)).to(device)
    encoder = run.encoder.phi if run.pairs else run.encoder
    assert isinstance(encoder, nn.Module)
    head = head.to(device)
    keys: list[str] = []
    rows: list[torch.Tensor] = []
    written, done, start = 0, 0, time.perf_counter()
    for batch in stream:
        todo = [i for i, key in enumerate(batch["key"]) if key not in skip]
        if not todo:
            continue
        # the whole batch, as a full run encodes it, then its new rows: a CPU kernel's result for a row can depend
        # on the rows beside it (oneDNN's AVX-512 convolutions: 5e-6 apart), and a rerun must write what a full
        # run writes, bit for bit. A rerun's cost: the done rows of the batches it resumes in.
        x = normalize.view(batch[field].to(device), None, 0, batch.get("size"))
        features = head(encoder(x).double(), spec["k"])
        rows.append(_take(features, todo).to(getattr(torch, spec["dtype"])).cpu())
        keys += [batch["key"][i] for i in todo]
        while len(keys) >= cfg.chunk_size:  # full chunks as soon as they fill; the rest at the end
            features = torch.cat(rows)
            write_chunk(out, env.rank, index, keys[: cfg.chunk_size], features[: cfg.chunk_size], spec)
            keys, rows, index, written = keys[cfg.chunk_size :], [features[cfg.chunk_size :]], index + 1, written + 1
            done += cfg.chunk_size
            _progress(env, done, stream.num_samples, index, time.perf_counter() - start)
    if keys:
        write_chunk(out, env.rank, index, keys, torch.cat(rows), spec)
        written += 1
    return stream.num_samples, written


PROGRESS_QUIET_S = 5.0  # a short embed prints nothing; a long one says how far it is at every chunk


def _progress(env, done: int, total: int, chunks: int, elapsed: float) -> None:
    """Rank 0's progress line at each chunk it writes, once the embed has run for PROGRESS_QUIET_S seconds (plain
    lines: they read the same in a terminal, a Slurm log and a CI log)."""
    if env.rank == 0 and elapsed >= PROGRESS_QUIET_S:
        share = f"~{total // env.world_size:,} (this rank's share)" if env.world_size > 1 else f"{total:,}"
        print(
            f"eigtrain-embed: {done:,} of {share} samples embedded ({chunks} chunks), {elapsed:.0f} s so far",
            flush=True,
        )


def finish(out: Path, manifest: dict, expected: int) -> dict:
    """Rank 0, once every rank is done: check exact coverage over all chunks and mark the manifest complete."""
    files = chunk_files(out)
    keys = [key for path in files for key in chunk_keys(path, manifest["settings"])]
    if len(keys) != expected or len(set(keys)) != len(keys):
        raise RuntimeError(
            f"out={out}: the chunks hold {len(keys)} samples ({len(set(keys))} distinct keys) but the split has "
            f"{expected}: samples were lost or duplicated (or keys repeat in the shards)"
        )
    manifest.update(count=len(keys), chunks=len(files), chunk_files=chunk_records(files), complete=True)
    write_manifest(out, manifest)
    return manifest


def run(cfg: EmbedConfig) -> dict:
    cfg.validate()
    assert cfg.run_dir and cfg.out  # validate() refuses either missing
    env = edist.resolve_env()
    device = edist.select_device(env, cfg.device)
    edist.init_distributed(env, backend=edist.backend_for(device))
    out = Path(cfg.out)
    old = check_out(out)  # before any work: never write into a directory of someone else's
    trained = open_run(cfg.run_dir, device=str(device), data=command_line_data(cfg.data))
    rr_dir, head, provenance = load_export(cfg, trained)
    spec = settings(cfg, trained, rr_dir, head, cfg.split or trained.data.split)
    if cfg.images:
        list_images(cfg.images)  # a missing folder or a bad line of a list: refused before anything is written
    lock = _writer(out, env.rank)  # one eigtrain-embed per out= (rank 0 holds it for the job)
    try:
        return _embed(cfg, env, device, out, None if cfg.overwrite else old, trained, head, spec, provenance)
    finally:
        release_directory(lock)


def _writer(out: Path, rank: int) -> int | None:
    if rank != 0:
        return None
    safe_files.make_dir(out)
    try:
        return lock_directory(out)
    except RunDirInUse:
        raise RunDirInUse(
            f"out={out} is being written by another eigtrain-embed: wait for it, or choose another out="
        ) from None


def _embed(cfg, env, device, out: Path, old: dict | None, trained, head, spec: dict, provenance) -> dict:
    if old is not None:
        check_same(out, old, spec)
        changed = changed_chunks(out, old) if old.get("complete") else []
        if old.get("complete") and not changed:  # nothing left to do: the output stays as it is
            if env.rank == 0:
                print(f"eigtrain-embed: {out} is complete ({old['count']} samples); nothing to do")
            return {"manifest": old, "chunks_written": 0}
        if changed and env.rank == 0:  # a chunk removed (or one not its own, refused below): embedded again
            print(
                f"eigtrain-embed: {out} changed since it was complete ({', '.join(changed[:3])}): checking its chunks"
            )
    manifest = {
        "format": FORMAT,
        "settings": spec,
        "dim": spec["k"],
        "eigenvalues": [float(v) for v in head.eigenvalues[: spec["k"]]],
        "export_provenance": provenance,
        "complete": False,
        "count": None,
    }
    edist.barrier()  # every rank has checked out= before rank 0 writes there
    if env.rank == 0:
        if cfg.overwrite:
            remove_own(out)
        write_manifest(out, manifest)
    edist.barrier()
    resume = resume_point(out, env.rank, spec)  # before any rank writes a chunk
    edist.barrier()
    expected, written = embed_share(cfg, trained, head, spec, env, str(device), out, resume)
    edist.barrier()
    if env.rank == 0:
        manifest = finish(out, manifest, expected)
        print(f"eigtrain-embed: {manifest['count']} samples x {spec['k']} features ({spec['dtype']}) in {out}")
    edist.barrier()
    return {"manifest": manifest, "chunks_written": written}


def read_embeddings(out: str | os.PathLike, k: int | None = None) -> tuple[list[str], torch.Tensor]:
    """(keys, features[:, :k]) of a complete eigtrain-embed output, sorted by key (the same for any world size), in
    the stored dtype; every chunk checked against the manifest first (one line naming what was removed or changed).
    `eigtrain.export.embed_read.iter_embeddings` streams the same rows as numpy blocks without holding them all."""
    keys: list[str] = []
    parts = []
    for block_keys, block in iter_embeddings(out, k, dtype=None):
        keys += block_keys
        parts.append(torch.from_numpy(block))
    features = torch.cat(parts)
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return [keys[i] for i in order], features[order]


def main(argv: list[str] | None = None) -> int:
    from eigtrain.cli import asks_for_help, compose_dataclass, one_line_errors

    args = sys.argv[1:] if argv is None else argv
    if asks_for_help(args, USAGE):
        return 0
    try:
        return one_line_errors("eigtrain-embed", lambda: run(compose_dataclass(EmbedConfig, args)))
    finally:
        edist.destroy()


if __name__ == "__main__":
    sys.exit(main())
