"""eigtrain-shards' work: write tar shards and their index (usage and configuration: eigtrain.data.shards_config,
checked before this module, and torch, are imported)."""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Mapping

import webdataset as wds

from eigtrain.data import write_marker
from eigtrain.data.idx_files import idx_source
from eigtrain.data.index import INDEX_NAME, ShardIndex, read_index, write_index
from eigtrain.data.shards_config import (  # noqa: F401  (checked before torch: eigtrain.commands)
    DEFAULT_VAL_FRACTION,
    SOURCES,
    USAGE,
    VAL_FRACTION_SOURCES,
    IndexArgs,
    WriteArgs,
    check_args,
    check_index_args,
    parse_args,
)
from eigtrain.data.sources import Source, cifar10_source, digits_source, imagefolder_source, npz_source

_SHARD_NAME = re.compile(r"^[A-Za-z0-9_.-]+-\d{6}\.tar$")  # what _ShardFile names a shard: <split>-NNNNNN.tar


def write_shards(
    out: str | os.PathLike,
    splits: Mapping[str, Iterable[dict]],
    *,
    shard_size: int = 1000,
    meta: dict | None = None,
    overwrite: bool = False,
) -> ShardIndex:
    """Write each split's samples, in the given order, to ``out/<split>-NNNNNN.tar`` and index them.

    Samples are dicts ``{"__key__": str, "<field>": bytes | int}`` (see `eigtrain.data.sources`). A key may
    occur once in the whole data set: splits never share a sample. `meta` goes to the index as is; when it
    does not say, ``meta["labels"]`` is set to whether every sample has a ``cls`` field.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    out = Path(out)
    if not (out / INDEX_NAME).exists():
        write_marker.clear_interrupted(out)  # an earlier write of eigtrain's that was killed: written again
    if (out / INDEX_NAME).exists():
        if not overwrite:
            raise FileExistsError(f"{out / INDEX_NAME} already exists; pass overwrite=true to replace the shards")
        old = read_index(out)
        for shards in old.splits.values():  # stale shards of a previous, larger write would linger otherwise
            for name in shards:
                if _SHARD_NAME.match(name):  # only a shard name it writes, in `out` itself (never `../x`)
                    (out / name).unlink(missing_ok=True)
        (out / INDEX_NAME).unlink()
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"out={out} is not empty and holds no eigtrain shards (no {INDEX_NAME}): refusing to write into it "
            f"(nothing was changed there); choose a new or empty directory"
        )
    out.mkdir(parents=True, exist_ok=True)
    write_marker.begin(out)  # first: until the index is written, the directory is eigtrain's write in progress

    split_of_key: dict[str, str] = {}
    counts: dict[str, dict[str, int]] = {}
    all_labeled = True
    for split, samples in splits.items():
        counts[split] = {}
        writer = None
        try:
            for sample in samples:
                key = sample["__key__"]
                if key in split_of_key:
                    raise ValueError(f"sample key {key!r} occurs twice (splits {split_of_key[key]!r} and {split!r})")
                split_of_key[key] = split
                all_labeled &= "cls" in sample
                if writer is None or writer.count == shard_size:
                    if writer is not None:
                        writer.close()
                    writer = _ShardFile(out, f"{split}-{len(counts[split]):06d}.tar")
                    counts[split][writer.name] = 0
                writer.write(sample)
                counts[split][writer.name] += 1
        except BaseException:
            if writer is not None:
                writer.discard()
            raise
        if writer is not None:
            writer.close()
    meta = dict(meta or {})
    meta.setdefault("labels", all_labeled and bool(split_of_key))
    write_index(out, counts, meta)
    write_marker.finish(out)
    return read_index(out)


class _ShardFile:
    """One tar shard, written under a temporary name and renamed when complete."""

    def __init__(self, root: Path, name: str):
        self.name, self.count = name, 0
        self.path, self.tmp = root / name, root / (name + ".tmp")
        if self.path.exists() or self.tmp.exists():  # not a shard of the index it replaced: someone else's file
            raise FileExistsError(
                f"{self.path} exists and is not listed in {root / INDEX_NAME}: refusing to replace it"
            )
        self.file = open(self.tmp, "xb")
        self.tar = wds.TarWriter(self.file, mtime=0)  # fixed mtime: identical input gives identical shards

    def write(self, sample: dict) -> None:
        self.tar.write(sample)
        self.count += 1

    def close(self) -> None:
        self.tar.close()
        self.file.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- CLI


def build_source(args: dict) -> Source:
    source, seed = args["source"], args["seed"]
    val_fraction = DEFAULT_VAL_FRACTION if args["val_fraction"] is None else args["val_fraction"]
    if source == "digits":
        return digits_source(val_fraction=val_fraction, seed=seed)
    path = Path(args["path"]).expanduser()
    if source == "cifar10":
        return cifar10_source(path, seed=seed)
    if source == "imagefolder":
        return imagefolder_source(path, seed=seed)
    if source == "idx":
        return idx_source(path, seed=seed)
    return npz_source(path, val_fraction=val_fraction, seed=seed)


def index_main(argv: list[str]) -> None:
    """``eigtrain-shards index PATTERN [out=FILE] [name=NAME]``."""
    from eigtrain.data.sample_counts import WIDS_INDEX_NAME, write_wids_index
    from eigtrain.data.shards import count_samples, expand_shards, local_path

    args = check_index_args(argv)
    urls = expand_shards(argv[0])
    out: str | Path | None = args.out
    if out is None:
        first = local_path(urls[0])
        if first is None:
            raise ValueError(f"the shards are not local files: give out=FILE for the index of {argv[0]}")
        out = first.parent / WIDS_INDEX_NAME
    _check_index_target(Path(out))
    with ThreadPoolExecutor(max(1, min(16, len(urls)))) as pool:
        counts = list(pool.map(lambda u: count_samples(u, args.timeout_s), urls))
    path = write_wids_index(out, urls, counts, args.name)
    print(json.dumps({"index": str(path), "shards": len(urls), "samples": sum(counts)}))


def _check_index_target(out: Path) -> None:
    """An index may replace an earlier wids shard index, never another file."""
    if not out.exists():
        return
    try:
        ours = json.loads(out.read_text()).get("__kind__") == "wids-shard-index-v1"
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise FileExistsError(
            f"out={out} exists and is not a wids shard index: refusing to replace it; choose another out="
        )


def write_source(args: dict) -> ShardIndex:
    """Write the shards `args` (checked by `check_args`) describe: eigtrain-shards, or a trainer's demo data."""
    source = build_source(args)
    meta = {**source.meta, "source": source.name, "seed": args["seed"], "shard_size": args["shard_size"]}
    splits = source.splits
    if args["limit"] is not None:  # a shuffled split's first samples: a random subset of it
        meta["limit"] = args["limit"]
        splits = {name: itertools.islice(samples, args["limit"]) for name, samples in splits.items()}
    return write_shards(args["out"], splits, shard_size=args["shard_size"], meta=meta, overwrite=args["overwrite"])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from eigtrain.cli import asks_for_help

    if asks_for_help(argv, USAGE):
        return None
    if argv and argv[0] == "index":
        try:
            return index_main(argv[1:])
        except (ValueError, OSError) as exn:
            raise SystemExit(f"eigtrain-shards index: error: {exn}") from None
    try:
        index = write_source(parse_args(argv))
    except (ValueError, OSError) as exn:
        raise SystemExit(f"eigtrain-shards: error: {exn}") from None
    summary = {
        split: {"shards": len(shards), "samples": sum(shards.values())} for split, shards in index.splits.items()
    }
    print(json.dumps({"out": str(index.root), "splits": summary}))


if __name__ == "__main__":
    main()
