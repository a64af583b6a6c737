"""eigtrain-embed's files: the manifest and the chunks, each chunk tied to the settings that made it.

Every chunk (``rank-R-chunk-IIIII.safetensors``: one tensor ``features`` and its rows' keys) carries in its metadata
the digest of the settings it was embedded with (`settings_id`: model weights, export, split, k, dtype, data). A
chunk is used only when that digest, its rows, width and dtype are the manifest's: a chunk copied in from another
output, or cut short, is refused in one line naming it, never counted. The complete manifest lists every chunk with
its size and sha256, so a chunk removed or replaced afterwards is found before the embeddings are read.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from eigtrain import safe_files
from eigtrain.runs.checksums import file_sha256

MANIFEST = "manifest.json"
FORMAT = "eigtrain-embeddings-v1"  # manifest["format"]: the mark of a directory eigtrain-embed wrote
# .NAME[.HEX].tmp: one being written (eigtrain.safe_files)
CHUNK = re.compile(r"\.?rank-(\d+)-chunk-(\d{5})\.safetensors(?:\.[0-9a-f]{12})?(\.tmp)?")
DTYPES = ("float16", "float32")  # torch's dtypes of these names; no torch here: reading chunks needs only numpy

if TYPE_CHECKING:
    import torch


def settings_id(spec: dict) -> str:
    """The digest of what the features are a function of (the manifest's settings)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:32]


def write_manifest(out: Path, manifest: dict) -> None:
    safe_files.write_text(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def chunk_files(out: Path) -> list[Path]:
    """The complete chunks in out=, by rank then index."""
    found = [(m, p) for p in out.iterdir() if (m := CHUNK.fullmatch(p.name)) and not p.name.startswith(".")]
    return [p for m, p in sorted(found, key=lambda mp: (int(mp[0][1]), int(mp[0][2])))]


def chunk_keys(path: Path, spec: dict | None = None) -> list[str]:
    """The keys of chunk `path`; with `spec` (the manifest's settings), also checked to be one of that output's
    chunks: its settings digest, one row per key, the width k and the dtype. ValueError (one line) otherwise."""
    try:
        with safe_open(str(path), "np") as f:
            meta = f.metadata() or {}
            keys = json.loads(meta["keys"])
            if spec is not None:
                shape, dtype = f.get_slice("features").get_shape(), f.get_slice("features").get_dtype()
    except (SafetensorError, KeyError, ValueError, OSError) as error:  # a chunk changed since it was written
        raise ValueError(f"cannot read the keys of {path} ({error!r}): not a chunk eigtrain-embed wrote") from None
    if spec is None:
        return keys
    expected = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(dtype)
    if meta.get("settings") != settings_id(spec):
        raise ValueError(
            f"{path} was embedded with other settings than this output's (another run, export, split, k or dtype): "
            f"remove it (it is re-embedded) or choose a new out="
        )
    if shape != [len(keys), spec["k"]] or expected != spec["dtype"]:
        raise ValueError(
            f"{path} holds {shape} {expected} features for {len(keys)} keys, not ({len(keys)}, {spec['k']}) "
            f"{spec['dtype']}: remove it (it is re-embedded)"
        )
    return keys


def write_chunk(out: Path, rank: int, index: int, keys: list[str], features: "torch.Tensor", spec: dict) -> Path:
    """One chunk, renamed into place once written: it exists only when complete; the same bytes for the same rows."""
    from safetensors.torch import save

    path = out / f"rank-{rank}-chunk-{index:05d}.safetensors"
    meta = {"keys": json.dumps(keys), "settings": settings_id(spec)}
    safe_files.write_bytes(path, _sorted_metadata(save({"features": features.contiguous()}, meta)))
    return path


def _sorted_metadata(data: bytes) -> bytes:
    """safetensors writes its metadata in a hash map's order, which changes from process to process: the header
    with the metadata sorted (same length, or padded with spaces as the format allows), so identical chunks are
    identical bytes whatever process wrote them. An unexpected header is left as it is (still a valid file)."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > size:
        return data
    return data[:8] + text.ljust(size, b" ") + data[8 + size :]


def chunk_records(files: list[Path]) -> dict[str, dict]:
    """{name: {bytes, sha256}} of the chunks: what the complete manifest records."""
    return {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files}


def changed_chunks(out: Path, manifest: dict) -> list[str]:
    """The chunks a complete manifest lists that are missing or not as it recorded them (size, then sha256), and
    chunk files it does not list."""
    recorded = manifest.get("chunk_files") or {}
    present = {p.name: p for p in chunk_files(out)}
    changed = sorted(set(present) ^ set(recorded))
    for name in sorted(set(present) & set(recorded)):
        record, path = recorded[name], present[name]
        if path.stat().st_size != record["bytes"] or file_sha256(path) != record["sha256"]:
            changed.append(name)
    return changed


def remove_own(out: Path) -> None:
    """overwrite=true: delete what eigtrain-embed wrote in out= (its manifest, chunks and their temporaries)."""
    for path in out.iterdir():
        if CHUNK.fullmatch(path.name) or path.name == MANIFEST or safe_files.temporary_of(path.name) == MANIFEST:
            path.unlink()
