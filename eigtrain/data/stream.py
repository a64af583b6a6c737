"""ShardStream: tar shards -> per-rank batches of uint8 tensors, with an exact-resume cursor.

The shards are an eigtrain-written directory (``root`` with its ``index.json``) or any webdataset shards
(``shards``: a brace pattern or list of URLs -- local, file:, http(s)://, pipe:, s3://, gs://; see
`eigtrain.data.sample_counts` for how their sample counts are found).

Per DataLoader worker the pipeline stages are, in order (see `eigtrain.data.plan` for the arithmetic):

1. plan    -- the shard list of this epoch, shuffled by (seed, restart, epoch), split by node, then by worker
              (below shard granularity when there are fewer shards than slots), as ReadTasks (shard, first
              sample, last sample) starting at the cursor;
2. read    -- tar members grouped into samples (webdataset's tar iterator), `mix_shards` tasks side by side;
              a sample the count promises but the tar does not deliver (missing, unreachable, truncated)
              becomes a `Corrupt` placeholder;
3. shuffle -- a seeded permutation per block of `shuffle_block` undecoded samples;
4. decode  -- to uint8 tensors, brought to `image_size` when set (center crop, or the whole image padded);
5. batch   -- `batch_size` consecutive positions of the slot's stream form one batch; unusable samples are
              dropped from it (so a batch may be short), never replaced, so batch boundaries never move.

The main process counts the unusable samples, warns about each and raises `CorruptDataError` naming the shard
and the key once there are more than `max_corrupt`.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import DataLoader

from eigtrain.data import plan
from eigtrain.data.decode import IMAGE_EXTS, Corrupt, DecodeSpec, parse_keys
from eigtrain.data.index import ShardIndex, read_index
from eigtrain.data.sample_counts import shard_counts
from eigtrain.data.shards import expand_shards
from eigtrain.data.stream_checks import MODES, as_size, check_stream, listed
from eigtrain.data.stream_read import NETWORK_RETRIES, WorkerPipeline, named_timeout, read_shard, read_tasks
from eigtrain.schema import DataConfig

log = logging.getLogger(__name__)

STATE_VERSION = 1
__all__ = ["MODES", "CorruptDataError", "ShardStream", "read_shard", "read_tasks"]


class CorruptDataError(RuntimeError):
    """More unusable samples than `max_corrupt`."""


class ShardStream:
    """Batches of one split for one rank, from the shards indexed in ``root/index.json`` or from ``shards``.

    Foreign shards: ``ShardStream(DataConfig(shards="https://host/train-{000000..000146}.tar", label_key="cls",
    image_size=[256, 256], image_fit="whole"), batch_size=64, seed=0, cache_dir=RUN_DIR/"data")``. `shards` is a brace
    pattern or a list of patterns/URLs (read in that order) holding exactly the split `split` (a config picks them
    by split: data.shards or data.val_shards, `eigtrain.data.from_config.split_shards`; `shards_key` names them in
    messages); their sample counts come from `shard_index` (a wids index), an index next to the shards, or a
    one-time scan cached in `cache_dir`. Their images are converted to `channels` (3: RGB; 1: grayscale, for an
    encoder trained on one-channel images), the channels eigtrain's own shards state in their index.

    Training mode (default): an endless iterator; every epoch each rank yields exactly `batches_per_epoch`
    batches, equal on all ranks; with ``resampled=False`` no sample appears twice in an epoch, and fewer than
    ``world_size * num_workers * batch_size`` samples are left out of it. ``resampled=True`` draws shards with
    replacement (the epoch is then a nominal ``num_samples`` samples).

    ``one_pass=True``: a single pass in which every sample is read exactly once across all ranks and workers;
    no padding, no wrap-around, the last batch of each worker may be short and ranks may yield different
    numbers of batches (`batches_per_epoch` is this rank's count). For evaluation and Rayleigh-Ritz.

    Batches are dicts of CPU tensors: ``"image"`` uint8 (B, C, H, W) in views mode, or ``"x"`` uint8 (B, C, H, W)
    and ``"a"`` (uint8 image batch or float32 (B, D) vectors) in pairs mode; ``"label"`` int64 (B,) (-1 without
    labels); ``"key"`` list[str]. B is `batch_size` except when unusable samples were dropped (or, in one-pass
    mode, at the end).

    The split across ranks and workers depends only on the arguments (never on an initialized process group).
    There must be at least ``world_size * num_workers`` shards unless ``resampled=True``: each worker reads its
    own shards. `state_dict` / `load_state_dict` give exact resume: a stream restored from the state of another
    one yields the batches that one would have yielded next. The state does not depend on the rank, so the
    trainer may save rank 0's and load it on every rank (only the corrupt-sample count in it is per rank).
    Use one live iterator per stream at a time.

    `data`: the schema's data dataclass (eigtrain.schema.DataConfig, each key's default and doc); the source is
    data.shards when set, else data.root. The rest is the job's (per-rank batch size, rank, world size, seed, ...).
    """

    def __init__(
        self,
        data: DataConfig,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int,
        one_pass: bool = False,
        cache_dir: str | os.PathLike | None = None,
        jpeg_device: torch.device | None = None,
        shards_key: str = "data.shards",
        channels: int = 3,
    ):
        check_stream(data, batch_size, (rank, world_size), seed, one_pass, jpeg_device is not None)
        split = data.split
        # The stream's own attributes: the cursor, the workers and the callers read them.
        self.split, self.batch_size, self.mode = split, batch_size, data.mode
        self.rank, self.world_size, self.num_workers, self.seed = rank, world_size, data.num_workers, seed
        self.resampled, self.one_pass, self.max_corrupt = data.resampled, one_pass, data.max_corrupt
        self.shuffle_block, self.prefetch_factor = data.shuffle_block, data.prefetch_factor
        self.pin_memory, self.persistent_workers = bool(data.pin_memory), data.persistent_workers  # null: off
        self.mix_shards, self.io_timeout_s = data.mix_shards, float(data.io_timeout_s)
        self.image_size, self.image_fit, self.jpeg_device = as_size(data.image_size), data.image_fit, jpeg_device
        self.foreign_channels = channels  # data.shards' images are decoded to this many channels

        if not data.shards:
            self.root: Path | None = Path(data.root or "")  # check_stream: data.root or data.shards
            self.where = f"split {split!r} of {self.root}"
            self.index: ShardIndex | None = read_index(self.root)
            names = self.index.shards(split)  # fails on an unknown or empty split
            self.index.check_files(split)  # fails on a missing or empty shard file, before any worker starts
            self.shards = [(str(self.root / name), n) for name, n in names]
            self.spec = self._decode_spec(self.index.meta)
        else:
            self.root, self.index = None, None
            urls = expand_shards(listed(data.shards) or [])  # check_stream: data.shards is set here
            self.where = f"{shards_key} ({len(urls)} shards, {urls[0]} ...)"
            counts = shard_counts(urls, cache_dir, data.shard_index, self.io_timeout_s)
            self.shards = list(zip(urls, counts))
            if sum(counts) == 0:
                raise ValueError(f"the shards of {self.where} hold no samples")
            self.spec = self._foreign_spec(data)
        self.spec = type(self.spec)(**{**vars(self.spec), "max_pixels": data.max_image_pixels})  # over it: undecoded
        self.num_samples = sum(n for _, n in self.shards)

        self.workers = max(data.num_workers, 1)  # num_workers=0 reads in this process, as one worker
        self.num_slots = world_size * self.workers
        if len(self.shards) < self.num_slots:  # slots then share shards, each reading its own sample range
            log.warning(
                "%s: %d shards for world_size x num_workers = %d x %d reader slots: slots share shards (each "
                "reads and discards the samples before its range); more, smaller shards read less",
                self.where,
                *(len(self.shards), world_size, self.workers),
            )
        self._plan_batches(one_pass)

        self._batches = 0  # batches this rank handed out: the cursor
        self._restart = 0  # bumped when a resume cannot be exact (layout changed): reshuffles from there on
        self._corrupt = 0

    def _plan_batches(self, one_pass: bool) -> None:
        """Batches per epoch: one pass gives each of this rank's workers its own tasks (their sizes fixed here);
        endless streams give every reader slot the same number of samples."""
        if one_pass:
            slots = range(self.rank * self.workers, (self.rank + 1) * self.workers)
            sizes = [sum(map(len, plan.one_pass_tasks(self.shards, s, self.num_slots))) for s in slots]
            self._worker_batches: list[int] | None = [math.ceil(n / self.batch_size) for n in sizes]
            self.batches_per_epoch = sum(self._worker_batches)
        else:
            self.per_slot = plan.samples_per_slot(self.num_samples, self.num_slots, self.batch_size)
            if self.per_slot == 0:
                raise ValueError(
                    f"{self.where} has {self.num_samples} samples, fewer than one batch per worker: world_size x "
                    f"num_workers x batch_size = {self.world_size} x {self.workers} x {self.batch_size}; lower "
                    f"batch_size or num_workers"
                )
            self._worker_batches = None  # endless
            self.batches_per_epoch = self.workers * self.per_slot // self.batch_size

    # -------------------------------------------------------------------------------------------- setup

    def _decode_spec(self, meta: dict) -> DecodeSpec:
        stored = meta.get("mode", "views")
        if stored != self.mode:
            raise ValueError(f"{self.root} holds {stored} data but the stream was asked for mode={self.mode!r}")

        def shape(stored, channels):  # of one image; only used to shape an empty batch
            if self.image_size is not None:
                return (channels, *self.image_size)
            return tuple(stored) if stored else (channels, 0, 0)

        channels = int(meta.get("channels", 3))
        a_kind = meta.get("a_kind", "image") if self.mode == "pairs" else None
        a_stored = meta.get("a_shape")
        a_channels = int(a_stored[0]) if a_kind == "image" and a_stored else channels
        a_shape = tuple(a_stored or [0]) if a_kind == "vector" else shape(a_stored, a_channels)
        image_keys = IMAGE_EXTS if self.mode == "views" else tuple("x." + e for e in IMAGE_EXTS)
        a_keys = ("a.npy",) if a_kind == "vector" else tuple("a." + e for e in IMAGE_EXTS)
        return DecodeSpec(
            self.mode,
            channels,
            image_keys,
            "cls" if meta.get("labels", False) else None,
            a_keys,
            a_kind,
            a_channels,
            self.image_size,
            self.image_fit,
            shape(meta.get("image_shape"), channels),
            a_shape,
            defer_jpeg=self.jpeg_device is not None,
        )

    def _foreign_spec(self, data) -> DecodeSpec:
        """Fields of shards other tools wrote: images (`foreign_channels`) under configurable member names."""
        channels = self.foreign_channels
        size = (channels, *self.image_size) if self.image_size else (channels, 0, 0)
        if self.mode == "views":
            return DecodeSpec(
                "views",
                channels,
                parse_keys(listed(data.image_key), IMAGE_EXTS),
                data.label_key,
                image_size=self.image_size,
                fit=self.image_fit,
                empty_image_shape=size,
                defer_jpeg=self.jpeg_device is not None,
            )
        a_keys = parse_keys(listed(data.a_key), tuple("a." + e for e in IMAGE_EXTS) + ("a.npy",))
        a_kind = "vector" if all(k.endswith("npy") for k in a_keys) else "image"
        return DecodeSpec(
            "pairs",
            channels,
            parse_keys(listed(data.x_key), tuple("x." + e for e in IMAGE_EXTS)),
            data.label_key,
            a_keys,
            a_kind,
            3,
            self.image_size,
            "cover",
            size,
            (3, *size[1:]) if a_kind == "image" else (0,),
        )

    # -------------------------------------------------------------------------------------------- iteration

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._batches // self.batches_per_epoch if self.batches_per_epoch else 0

    def __iter__(self) -> Iterator[dict]:
        starts, rotation = plan.round_robin_resume(self._batches, self._worker_batches, self.workers)
        dataset = WorkerPipeline(self, starts, rotation)
        if self.num_workers == 0:
            batches = iter(dataset)
        else:
            # every read is bounded by io_timeout_s; this bounds the rest (a worker that stalls elsewhere), and is
            # longer than the slowest batch bounded reads allow: each of mix_shards readers stalling every attempt
            timeout = self.io_timeout_s * (self.mix_shards * (NETWORK_RETRIES + 1) + 2)
            loader = DataLoader(
                dataset,
                batch_size=None,
                num_workers=self.num_workers,
                pin_memory=self.pin_memory,
                prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers,
                timeout=timeout,
            )
            batches = named_timeout(iter(loader), self.where, timeout)
        if self.jpeg_device is not None:  # JPEGs left encoded by the workers: decoded ahead, on the device
            from eigtrain.data.decode_ahead import finished_ahead

            batches = finished_ahead(batches, self.spec, self.jpeg_device)
        for batch in batches:
            self._count_corrupt(batch.pop("corrupt"))
            self._batches += 1
            yield batch

    def _count_corrupt(self, corrupt: list[Corrupt]) -> None:
        for c in corrupt:
            self._corrupt += 1
            if self._corrupt > self.max_corrupt:
                raise CorruptDataError(
                    f"{self._corrupt} unusable samples in {self.where}, more than "
                    f"max_corrupt={self.max_corrupt}; the last: shard {c.shard}, key {c.key}: {c.reason}"
                )
            log.warning(
                "skipping unusable sample %d/%d: shard %s, key %s: %s",
                self._corrupt,
                self.max_corrupt,
                c.shard,
                c.key,
                c.reason,
            )

    @property
    def corrupt_count(self) -> int:
        return self._corrupt

    # -------------------------------------------------------------------------------------------- cursor

    def _layout(self) -> list[int]:
        return [self.world_size, self.workers, self.batch_size]

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "num_samples": self.num_samples,
            "seed": self.seed,
            "resampled": self.resampled,
            "one_pass": self.one_pass,
            "layout": self._layout(),
            "batches_per_epoch": self.batches_per_epoch,
            "batches": self._batches,
            "restart": self._restart,
            "corrupt": self._corrupt,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue where the stream that saved `state` stopped.

        With the same world size, number of workers and batch size the continuation is exact. With a different
        layout it cannot be: the stream keeps the epoch and the fraction of it already seen, and reshuffles
        (restart counter + 1) so the rest of the epoch is a fresh random selection. It warns when that happens.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"stream state has version {state.get('version')}, expected {STATE_VERSION}")
        for key in ("split", "num_samples", "seed", "resampled", "one_pass"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"stream state does not match this stream: {key} is {state[key]!r} in the state and "
                    f"{getattr(self, key)!r} here"
                )
        self._corrupt = state["corrupt"]
        if list(state["layout"]) == self._layout():
            self._batches, self._restart = state["batches"], state["restart"]
            return
        if self.one_pass:
            raise ValueError(
                f"cannot resume a one-pass stream saved with world_size, num_workers, batch_size = "
                f"{state['layout']} as {self._layout()}"
            )
        old_world, _, old_batch = state["layout"]
        epoch, done = divmod(state["batches"], state["batches_per_epoch"])
        seen = done * old_batch * old_world  # samples of this epoch already used, over all ranks
        done_new = min(math.ceil(seen / (self.batch_size * self.world_size)), self.batches_per_epoch)
        self._batches = epoch * self.batches_per_epoch + done_new
        self._restart = state["restart"] + 1
        log.warning(
            "stream layout changed from (world_size, num_workers, batch_size) = %s to %s: resuming epoch %d at "
            "batch %d of %d with a new shuffle; this resume is not exact",
            state["layout"],
            self._layout(),
            epoch,
            done_new,
            self.batches_per_epoch,
        )
