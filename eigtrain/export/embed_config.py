"""eigtrain-embed's configuration and usage: read, and checked, before torch is imported (eigtrain.commands)."""

from __future__ import annotations

from dataclasses import dataclass, field

from eigtrain.export.run_data import RunDataConfig

USAGE = """eigtrain-embed: the ordered features of every sample of a split, in chunks with their keys.

    eigtrain-embed run_dir=DIR out=DIR [split=train|val] [data.shards=PATTERN] [data.val_shards=PATTERN]
                   [images=DIR|LIST.txt] [rr=DIR] [k=K] [dtype=float32|float16] [chunk_size=4096] [batch_size=256] [num_workers=1]
    torchrun --nproc_per_node N -m eigtrain.export.corpus ...    # each rank embeds its share

Features are the run's Rayleigh-Ritz export (rr=, default run_dir/rr) applied to its encoder, first k in
eigenvalue order. A rerun with the same settings resumes; read them with eigtrain.export.corpus.read_embeddings.
images= embeds image files instead of the run's shards: a folder (keys: paths relative to it) or a text file
listing one image path per line (relative to the list's folder, or absolute); each image is brought to the run's
image size and normalized as the run's shards are.
"""


@dataclass
class EmbedConfig:
    run_dir: str | None = None  # the trained run (its final export, else its newest checkpoint that verifies)
    out: str | None = None  # the output directory: new, empty, or an earlier eigtrain-embed output to resume
    rr: str | None = None  # the Rayleigh-Ritz export applied (null: run_dir/rr); it must be of the run's weights
    split: str | None = None  # null: the run's training split (data.shards given here: the corpus); val: held out
    images: str | None = None  # instead of shards: a folder of image files, or a text file listing one path a line
    k: int | None = None  # store the first k features (null: all the export has)
    dtype: str = "float32"  # of the stored features (computed in float64 from the encoder's float32 output)
    chunk_size: int = 4096  # rows per chunk file (each rank its own chunks); a rerun resumes at the first missing
    batch_size: int = 256  # samples per encoder call (1: features independent of batch mates, bitwise on any CPU ranks)
    num_workers: int = 1  # reader processes per rank
    device: str = "cpu"  # cpu | cuda | auto (this rank's GPU when there is one)
    allow_foreign_export: bool = False  # apply an export solved on other weights (recorded in the manifest)
    overwrite: bool = False  # start over: delete what eigtrain-embed wrote in out= (its manifest and chunks) first
    data: RunDataConfig = field(default_factory=RunDataConfig)  # data sources replacing the run's saved ones

    def validate(self) -> "EmbedConfig":
        """The checks that need no data and no torch: one line naming the key."""
        if not self.run_dir or not self.out:
            raise ValueError("give run_dir=DIR and out=DIR")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is unknown; allowed: {', '.join(DTYPES)}")
        if self.images and (self.split or self.data.shards or self.data.val_shards):
            raise ValueError("images= is the data embedded: give it without split=, data.shards= or data.val_shards=")
        if self.k is not None and self.k < 1:
            raise ValueError(f"k={self.k}: give a size >= 1 (or null: every feature of the export)")
        return self


DTYPES = ("float16", "float32")  # the stored features' (eigtrain.export.embed_chunks maps them to torch's)
