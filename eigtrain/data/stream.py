"""ShardStream: tar shards -> per-rank batches of uint8 tensors, with an exact-resume cursor.

Per DataLoader worker the pipeline stages are, in order (see `eigtrain.data.plan` for the arithmetic):

1. plan    -- the shard list of this epoch, shuffled by (seed, restart, epoch), split by node, then by worker,
              as ReadTasks (shard, first sample, last sample) starting at the cursor;
2. read    -- tar members grouped into samples (webdataset's tar iterator); a sample the index promises but the
              tar does not deliver (truncated or unreadable shard) becomes a `Corrupt` placeholder;
3. shuffle -- a seeded permutation per block of `shuffle_block` undecoded samples;
4. decode  -- to uint8 tensors, with the fixed-size resize/crop when `image_size` is set;
5. batch   -- `batch_size` consecutive positions of the slot's stream form one batch; unusable samples are
              dropped from it (so a batch may be short), never replaced, so batch boundaries never move.

The main process counts the unusable samples, warns about each and raises `CorruptDataError` naming the shard
and the key once there are more than `max_corrupt`.
"""

from __future__ import annotations

import logging
import math
import os
from itertools import count, islice
from pathlib import Path
from typing import Iterator

import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import plan
from .decode import Corrupt, DecodeSpec, collate, decode_sample
from .index import read_index

log = logging.getLogger(__name__)

STATE_VERSION = 1
MODES = ("views", "pairs")


class CorruptDataError(RuntimeError):
    """More unusable samples than `max_corrupt`."""


class ShardStream:
    """Batches of one split for one rank, from the shards indexed in ``root/index.json``.

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

    Arguments not covered above: `batch_size` is per rank; `num_workers=0` reads in the calling process;
    `image_size` (int or (H, W)) makes the workers resize (shorter side) and center-crop every image, None keeps
    the stored size (then all images must share it); `max_corrupt` is how many unusable samples are skipped with
    a warning before `CorruptDataError`; `shuffle_block` is how many undecoded samples each worker shuffles
    together (and holds in memory; 0 or 1: no shuffling beyond the shard order).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        split: str = "train",
        batch_size: int = 64,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 2,
        seed: int = 0,
        mode: str = "views",
        image_size: int | tuple[int, int] | None = None,
        resampled: bool = False,
        one_pass: bool = False,
        max_corrupt: int = 10,
        shuffle_block: int = 1000,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
    ):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if max_corrupt < 0:
            raise ValueError(f"max_corrupt must be >= 0, got {max_corrupt}")
        if one_pass and resampled:
            raise ValueError("one_pass=True reads every sample exactly once; it cannot be combined with resampled=True")

        self.root, self.split, self.batch_size, self.mode = Path(root), split, batch_size, mode
        self.rank, self.world_size, self.num_workers, self.seed = rank, world_size, num_workers, seed
        self.resampled, self.one_pass, self.max_corrupt = resampled, one_pass, max_corrupt
        self.shuffle_block, self.pin_memory, self.prefetch_factor = shuffle_block, pin_memory, prefetch_factor
        self.image_size = _as_size(image_size)

        self.index = read_index(self.root)
        self.shards = self.index.shards(split)  # fails on an unknown or empty split
        self.index.check_files(split)  # fails on a missing or empty shard file, before any worker starts
        self.num_samples = sum(n for _, n in self.shards)
        self.spec = self._decode_spec(self.index.meta)

        self.workers = max(num_workers, 1)  # num_workers=0 reads in this process, as one worker
        self.num_slots = world_size * self.workers
        if not resampled and len(self.shards) < self.num_slots:
            raise ValueError(
                f"split {split!r} of {self.root} has {len(self.shards)} shards, fewer than world_size x num_workers "
                f"= {world_size} x {self.workers}; write smaller shards (shard_size) or use fewer workers"
                + ("" if one_pass else ", or pass resampled=True")
            )
        if one_pass:
            slots = range(rank * self.workers, (rank + 1) * self.workers)
            sizes = [sum(map(len, plan.one_pass_tasks(self.shards, s, self.num_slots))) for s in slots]
            self._worker_batches = [math.ceil(n / batch_size) for n in sizes]
            self.batches_per_epoch = sum(self._worker_batches)
        else:
            self.per_slot = plan.samples_per_slot(self.num_samples, self.num_slots, batch_size)
            if self.per_slot == 0:
                raise ValueError(
                    f"split {split!r} has {self.num_samples} samples, fewer than one batch per worker: world_size x "
                    f"num_workers x batch_size = {world_size} x {self.workers} x {batch_size}; lower batch_size or "
                    f"num_workers"
                )
            self._worker_batches = None  # endless
            self.batches_per_epoch = self.workers * self.per_slot // batch_size

        self._batches = 0  # batches this rank handed out: the cursor
        self._restart = 0  # bumped when a resume cannot be exact (layout changed): reshuffles from there on
        self._corrupt = 0

    # -------------------------------------------------------------------------------------------- setup

    def _decode_spec(self, meta: dict) -> DecodeSpec:
        stored = meta.get("mode", "views")
        if stored != self.mode:
            raise ValueError(
                f"{self.root} holds {stored} data but the stream was asked for mode={self.mode!r}"
            )
        def shape(stored, channels):  # of one image; only used to shape an empty batch
            if self.image_size is not None:
                return (channels, *self.image_size)
            return tuple(stored) if stored else (channels, 0, 0)

        channels = int(meta.get("channels", 3))
        a_kind = meta.get("a_kind", "image") if self.mode == "pairs" else None
        a_stored = meta.get("a_shape")
        a_channels = int(a_stored[0]) if a_kind == "image" and a_stored else channels
        a_shape = tuple(a_stored or [0]) if a_kind == "vector" else shape(a_stored, a_channels)
        return DecodeSpec(self.mode, channels, bool(meta.get("labels", False)), a_kind, a_channels,
                          self.image_size, shape(meta.get("image_shape"), channels), a_shape)

    # -------------------------------------------------------------------------------------------- iteration

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._batches // self.batches_per_epoch if self.batches_per_epoch else 0

    def __iter__(self) -> Iterator[dict]:
        starts, rotation = plan.round_robin_resume(self._batches, self._worker_batches, self.workers)
        dataset = _WorkerPipeline(self, starts, rotation)
        if self.num_workers == 0:
            batches = iter(dataset)
        else:
            batches = iter(DataLoader(dataset, batch_size=None, num_workers=self.num_workers,
                                      pin_memory=self.pin_memory, prefetch_factor=self.prefetch_factor))
        for batch in batches:
            self._count_corrupt(batch.pop("corrupt"))
            self._batches += 1
            yield batch

    def _count_corrupt(self, corrupt: list[Corrupt]) -> None:
        for c in corrupt:
            self._corrupt += 1
            if self._corrupt > self.max_corrupt:
                raise CorruptDataError(
                    f"{self._corrupt} unusable samples in split {self.split!r} of {self.root}, more than "
                    f"max_corrupt={self.max_corrupt}; the last: shard {c.shard}, key {c.key}: {c.reason}"
                )
            log.warning("skipping unusable sample %d/%d: shard %s, key %s: %s",
                        self._corrupt, self.max_corrupt, c.shard, c.key, c.reason)

    @property
    def corrupt_count(self) -> int:
        return self._corrupt

    # -------------------------------------------------------------------------------------------- cursor

    def _layout(self) -> list[int]:
        return [self.world_size, self.workers, self.batch_size]

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION, "split": self.split, "num_samples": self.num_samples,
            "seed": self.seed, "resampled": self.resampled, "one_pass": self.one_pass,
            "layout": self._layout(), "batches_per_epoch": self.batches_per_epoch,
            "batches": self._batches, "restart": self._restart, "corrupt": self._corrupt,
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
            "batch %d of %d with a new shuffle; this resume is not exact", state["layout"], self._layout(),
            epoch, done_new, self.batches_per_epoch,
        )


class _WorkerPipeline(IterableDataset):
    """What runs inside each DataLoader worker: plan -> read -> shuffle -> decode -> batch."""

    def __init__(self, stream: ShardStream, starts: list[int], rotation: int):
        self.root, self.shards, self.spec = stream.root, stream.shards, stream.spec
        self.batch_size, self.workers, self.num_slots = stream.batch_size, stream.workers, stream.num_slots
        self.rank, self.seed, self.restart = stream.rank, stream.seed, stream._restart
        self.resampled, self.one_pass, self.shuffle_block = stream.resampled, stream.one_pass, stream.shuffle_block
        self.per_slot = None if stream.one_pass else stream.per_slot
        self.starts, self.rotation = starts, rotation

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker = ((0 if info is None else info.id) + self.rotation) % self.workers
        slot = self.rank * self.workers + worker
        for raw in self._raw_batches(slot, self.starts[worker]):
            decoded, corrupt = [], []
            for sample in raw:
                if isinstance(sample, Corrupt):
                    corrupt.append(sample)
                    continue
                try:
                    decoded.append(decode_sample(sample, self.spec))
                except Exception as exn:  # any failure to decode makes the sample unusable, nothing more
                    corrupt.append(Corrupt(sample["__url__"], sample["__key__"], f"{type(exn).__name__}: {exn}"))
            yield collate(decoded, corrupt, self.spec)

    def _raw_batches(self, slot: int, start: int) -> Iterator[list]:
        """Undecoded batches of `slot` from its batch number `start` on."""
        if self.one_pass:
            tasks = plan.one_pass_tasks(self.shards, slot, self.num_slots)
            yield from _chunks(read_tasks(self.root, plan.skip(tasks, start * self.batch_size)), self.batch_size)
            return
        per_epoch = self.per_slot // self.batch_size
        epoch, first = divmod(start, per_epoch)
        for epoch in count(epoch):
            tasks = plan.train_epoch_tasks(self.shards, slot, self.num_slots, self.per_slot, self.seed,
                                           self.restart, epoch, self.resampled)
            samples = self._shuffled(tasks, slot, epoch, first * self.batch_size)
            yield from _chunks(samples, self.batch_size)
            first = 0

    def _shuffled(self, tasks: list[plan.ReadTask], slot: int, epoch: int, start: int) -> Iterator:
        """The slot's epoch in block-shuffled order, from position `start` on."""
        block = self.shuffle_block
        if block <= 1:
            yield from read_tasks(self.root, plan.skip(tasks, start))
            return
        first = start // block
        samples = read_tasks(self.root, plan.skip(tasks, first * block))
        for b in count(first):
            chunk = list(islice(samples, block))
            if not chunk:
                return
            perm = plan.block_permutation(self.seed, self.restart, epoch, slot, b, len(chunk))
            chunk = [chunk[i] for i in perm]
            yield from (chunk[start - first * block:] if b == first else chunk)


def _chunks(samples: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(samples, size)):
        yield chunk


def read_tasks(root: Path, tasks: list[plan.ReadTask]) -> Iterator[dict | Corrupt]:
    """Samples of the tasks, in order: exactly ``len(task)`` items per task, `Corrupt` for any not delivered."""
    for task in tasks:
        yield from read_shard(root, task)


def read_shard(root: Path, task: plan.ReadTask) -> Iterator[dict | Corrupt]:
    position, last_key, error = 0, None, "the tar has fewer samples than the index says"
    try:
        with open(root / task.shard, "rb") as f:
            files = ({**f, "__url__": task.shard} for f in wds.tariterators.tar_file_iterator(f))
            for sample in wds.tariterators.group_by_keys(files):
                if position >= task.stop:
                    break
                if position >= task.start:
                    yield sample
                last_key, position = sample["__key__"], position + 1
    except Exception as exn:  # truncated or unreadable tar: what was read stays valid
        error = f"{type(exn).__name__}: {exn}"
    for missing in range(max(position, task.start), task.stop):
        where = f"sample #{missing} (after key {last_key!r})" if last_key else f"sample #{missing}"
        yield Corrupt(task.shard, where, f"not readable from the shard: {error}")


def _as_size(size: int | tuple[int, int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if isinstance(size, int):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"image_size must be None, an int or (H, W), got {size}")
    return size
