"""eigtrain-shards: write tar shards and their index.

    eigtrain-shards source=digits out=data/digits shard_size=500 val_fraction=0.2 seed=0
    eigtrain-shards source=cifar10 path=~/cifar-10-batches-py out=data/cifar10 shard_size=1000
    eigtrain-shards source=imagefolder path=~/imagenette2 out=data/imagenette shard_size=1000
    eigtrain-shards source=npz path=pairs.npz out=data/pairs val_fraction=0.1
    eigtrain-shards source=idx path=/usr/share/datasets/fashion-mnist out=data/fashion_mnist
    eigtrain-shards index 'data/in1k/train-{000000..001023}.tar'          # -> data/in1k/wids-index.json
    eigtrain-shards index 'https://host/in1k/train-{000000..001023}.tar' out=in1k-train.json

``index`` counts the samples of existing webdataset shards (any tool's) once and writes a `wids` shard index
(next to local shards, or to ``out=FILE``), which ``data.shards`` finds there (or takes as ``data.shard_index``)
instead of counting again for every run.

Shards are ``OUT/<split>-NNNNNN.tar`` with ``shard_size`` samples each (the last one of a split may be shorter);
``OUT/index.json`` is written last, so a directory with an index holds complete shards only.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from eigtrain.cli import compose_dataclass

USAGE = __doc__  # eigtrain-shards -h (eigtrain.commands): this module is its configuration, read before torch


@dataclass
class WriteArgs:
    source: str = "digits"  # digits (scikit-learn's) | cifar10 | imagefolder | npz | idx (MNIST-format files)
    out: str | None = None  # the shard directory written (shards and index.json)
    path: str | None = None  # the source's files (every source but digits)
    shard_size: int = 1000  # samples per shard
    val_fraction: float | None = None  # digits and npz: the share held out as split val (null: 0.2)
    seed: int = 0  # the order of the samples and the train/val split
    overwrite: bool = False  # replace shards eigtrain wrote at out (anything else there is refused)
    limit: int | None = None  # at most this many samples per split, the first of its shuffled order (null: all)


SOURCES = ("digits", "cifar10", "imagefolder", "npz", "idx")
VAL_FRACTION_SOURCES = ("digits", "npz")  # the other sources come with their own splits
DEFAULT_VAL_FRACTION = 0.2


def parse_args(argv: list[str]) -> dict:
    """key=value arguments; an unknown key or a bad value is one error that names it."""
    return check_args(asdict(compose_dataclass(WriteArgs, argv)))


def check_args(args: dict) -> dict:
    """`args` (the fields of WriteArgs) when they make a command; else a ValueError naming the key."""
    if args["source"] not in SOURCES:
        raise ValueError(f"unknown source {args['source']!r}; allowed: {list(SOURCES)}")
    if args["out"] is None:
        raise ValueError("missing out=DIR (where the shards and index.json go)")
    needs_path = args["source"] != "digits"
    if needs_path and args["path"] is None:
        raise ValueError(f"source={args['source']} needs path=...")
    if not needs_path and args["path"] is not None:
        raise ValueError("source=digits takes no path (the data ships with scikit-learn)")
    if args["limit"] is not None and args["limit"] < 1:
        raise ValueError(f"limit must be >= 1 (or null: every sample), got {args['limit']}")
    if args["val_fraction"] is not None and args["source"] not in VAL_FRACTION_SOURCES:
        raise ValueError(f"val_fraction does not apply to source={args['source']}: its splits are given by the files")
    return args


@dataclass
class IndexArgs:
    out: str | None = None  # the index file (null: next to local shards)
    name: str = ""  # the data set's name in the index
    timeout_s: float = 60.0  # bound on every network read while counting


def check_index_args(argv: list[str]) -> IndexArgs:
    """``index PATTERN [out=FILE] [name=NAME]``'s arguments after the pattern; a ValueError naming what is wrong."""
    if not argv or re.match(r"^[A-Za-z_][\w.]*=", argv[0]):  # key=value, not a pattern (a URL's query has '=')
        raise ValueError(
            "usage: eigtrain-shards index PATTERN [out=FILE] [name=NAME] (PATTERN: brace pattern of shards)"
        )
    return compose_dataclass(IndexArgs, argv[1:])
