"""ShardStream: tar shards -> per-rank batches of uint8 tensors, with an exact-resume cursor.

The shards are an eigtrain-written directory (``root`` with its ``index.json``) or any webdataset shards
(``shards``: a brace pattern or list of URLs -- local, file:, http(s)://, pipe:, s3://, gs://; see
`eigtrain.data.shards` for how their sample counts are found).

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
import time
from itertools import count, islice
from pathlib import Path
from typing import Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from . import plan
from .decode import FITS, IMAGE_EXTS, Corrupt, DecodeSpec, collate, decode_sample, parse_keys
from .index import read_index
from .shards import (DEFAULT_TIMEOUT_S, PermanentShardError, complete_samples, expand_shards, local_path, open_url,
                     shard_counts)

log = logging.getLogger(__name__)

STATE_VERSION = 1
NETWORK_RETRIES = 2  # reopenings of a network shard whose read failed midway
MODES = ("views", "pairs")


class CorruptDataError(RuntimeError):
    """More unusable samples than `max_corrupt`."""


class ShardStream:
    """Batches of one split for one rank, from the shards indexed in ``root/index.json`` or from ``shards``.

    Foreign shards: ``ShardStream(shards="https://host/train-{000000..000146}.tar", label_key="cls",
    image_size=256, image_fit="whole", cache_dir=RUN_DIR/"data", ...)``. `shards` is a brace pattern or a list
    of patterns/URLs (read in that order) holding exactly the split `split` (a config picks them by split:
    data.shards or data.val_shards, `eigtrain.data.from_config.split_shards`; `shards_key` names them in
    messages); their sample counts come from
    `shard_index` (a wids index), an index next to the shards, or a one-time scan cached in `cache_dir`.
    Fields: `image_key` (member-name alternatives, default ``jpg;jpeg;png;webp``, or ``x.*`` / ``a.*`` in
    pairs mode: `x_key`, `a_key`, an ``.npy`` member being a vector), `label_key` (``cls``, ``json:FIELD`` or
    None). Images are RGB.

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
    `image_size` (int or (H, W)) makes the workers bring every image to that size: ``image_fit="cover"``
    resizes (shorter side) and center-crops, ``"whole"`` fits the whole image inside, pads, and adds the valid
    sizes as ``"size"`` int64 (B, 2) so the augmentation crops from the whole image; None keeps the stored size
    (then all images must share it). `max_corrupt` is how many unusable samples are skipped with a warning
    before `CorruptDataError`; `shuffle_block` is how many undecoded samples each worker shuffles together
    (and holds in memory; 0 or 1: no shuffling beyond the shard order); `mix_shards` is how many shards each
    worker reads side by side (so class-ordered shards still give mixed batches; 1: one after the other).
    `jpeg_device`: decode JPEG images batched in the main process on that device (nvJPEG on CUDA, see
    `eigtrain.data.gpu_decode`) instead of in the workers. `pin_memory`, `prefetch_factor`, `persistent_workers`
    go to the DataLoader; `io_timeout_s` bounds every network read.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
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
        *,
        shards: str | list[str] | None = None,
        image_key: str | list[str] | None = None,
        label_key: str | None = None,
        x_key: str | list[str] | None = None,
        a_key: str | list[str] | None = None,
        image_fit: str = "cover",
        mix_shards: int = 8,
        cache_dir: str | os.PathLike | None = None,
        shard_index: str | None = None,
        io_timeout_s: float = DEFAULT_TIMEOUT_S,
        persistent_workers: bool = False,
        jpeg_device=None,
        shards_key: str = "data.shards",
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
        if (root is None) == (shards is None):
            raise ValueError("give exactly one of root (an eigtrain shard directory) and shards (a pattern or list)")
        if image_fit not in FITS:
            raise ValueError(f"image_fit must be one of {FITS}, got {image_fit!r}")
        if image_fit == "whole" and mode == "pairs":
            raise ValueError("image_fit='whole' needs mode='views' (stored pairs are used as they are: use 'cover')")
        if mix_shards < 1:
            raise ValueError(f"mix_shards must be >= 1, got {mix_shards}")

        self.split, self.batch_size, self.mode = split, batch_size, mode
        self.rank, self.world_size, self.num_workers, self.seed = rank, world_size, num_workers, seed
        self.resampled, self.one_pass, self.max_corrupt = resampled, one_pass, max_corrupt
        self.shuffle_block, self.pin_memory, self.prefetch_factor = shuffle_block, pin_memory, prefetch_factor
        self.persistent_workers, self.mix_shards, self.io_timeout_s = persistent_workers, mix_shards, io_timeout_s
        self.image_size, self.image_fit, self.jpeg_device = _as_size(image_size), image_fit, jpeg_device
        if jpeg_device is not None and mode != "views":
            raise ValueError("jpeg_device (batched JPEG decoding) needs mode='views'")

        if root is not None:
            self.root = Path(root)
            self.where = f"split {split!r} of {self.root}"
            self.index = read_index(self.root)
            names = self.index.shards(split)  # fails on an unknown or empty split
            self.index.check_files(split)  # fails on a missing or empty shard file, before any worker starts
            self.shards = [(str(self.root / name), n) for name, n in names]
            self.spec = self._decode_spec(self.index.meta)
        else:
            self.root, self.index = None, None
            urls = expand_shards(shards)
            self.where = f"{shards_key} ({len(urls)} shards, {urls[0]} ...)"
            counts = shard_counts(urls, cache_dir, shard_index, io_timeout_s)
            self.shards = list(zip(urls, counts))
            if sum(counts) == 0:
                raise ValueError(f"the shards of {self.where} hold no samples")
            self.spec = self._foreign_spec(image_key, label_key, x_key, a_key)
        self.num_samples = sum(n for _, n in self.shards)

        self.workers = max(num_workers, 1)  # num_workers=0 reads in this process, as one worker
        self.num_slots = world_size * self.workers
        if len(self.shards) < self.num_slots:  # slots then share shards, each reading its own sample range
            log.warning(
                "%s: %d shards for world_size x num_workers = %d x %d reader slots: slots share shards (each "
                "reads and discards the samples before its range); more, smaller shards read less",
                self.where, len(self.shards), world_size, self.workers)
        if one_pass:
            slots = range(rank * self.workers, (rank + 1) * self.workers)
            sizes = [sum(map(len, plan.one_pass_tasks(self.shards, s, self.num_slots))) for s in slots]
            self._worker_batches = [math.ceil(n / batch_size) for n in sizes]
            self.batches_per_epoch = sum(self._worker_batches)
        else:
            self.per_slot = plan.samples_per_slot(self.num_samples, self.num_slots, batch_size)
            if self.per_slot == 0:
                raise ValueError(
                    f"{self.where} has {self.num_samples} samples, fewer than one batch per worker: world_size x "
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
        image_keys = IMAGE_EXTS if self.mode == "views" else tuple("x." + e for e in IMAGE_EXTS)
        a_keys = ("a.npy",) if a_kind == "vector" else tuple("a." + e for e in IMAGE_EXTS)
        return DecodeSpec(self.mode, channels, image_keys, "cls" if meta.get("labels", False) else None, a_keys,
                          a_kind, a_channels, self.image_size, self.image_fit, shape(meta.get("image_shape"), channels),
                          a_shape, defer_jpeg=self.jpeg_device is not None)

    def _foreign_spec(self, image_key, label_key, x_key, a_key) -> DecodeSpec:
        """Fields of shards other tools wrote: RGB images under configurable member names."""
        size = (3, *self.image_size) if self.image_size else (3, 0, 0)
        if self.mode == "views":
            return DecodeSpec("views", 3, parse_keys(image_key, IMAGE_EXTS), label_key, image_size=self.image_size,
                              fit=self.image_fit, empty_image_shape=size, defer_jpeg=self.jpeg_device is not None)
        a_keys = parse_keys(a_key, tuple("a." + e for e in IMAGE_EXTS) + ("a.npy",))
        a_kind = "vector" if all(k.endswith("npy") for k in a_keys) else "image"
        return DecodeSpec("pairs", 3, parse_keys(x_key, tuple("x." + e for e in IMAGE_EXTS)), label_key, a_keys,
                          a_kind, 3, self.image_size, "cover", size, size if a_kind == "image" else (0,))

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
            # every read is bounded by io_timeout_s; this bounds the rest (a worker that stalls elsewhere), and is
            # longer than the slowest batch bounded reads allow: each of mix_shards readers stalling every attempt
            timeout = self.io_timeout_s * (self.mix_shards * (NETWORK_RETRIES + 1) + 2)
            loader = DataLoader(dataset, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                                prefetch_factor=self.prefetch_factor, persistent_workers=self.persistent_workers,
                                timeout=timeout)
            batches = _named_timeout(iter(loader), self.where, timeout)
        decoder = None
        if self.jpeg_device is not None:
            from .gpu_decode import JpegDecoder, finish_batch

            decoder = JpegDecoder(self.jpeg_device)
        for batch in batches:
            if decoder is not None:
                batch = finish_batch(batch, self.spec, self.jpeg_device, decoder)
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
        self.shards, self.spec, self.mix_shards, self.timeout = stream.shards, stream.spec, stream.mix_shards, stream.io_timeout_s
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
            yield from _chunks(read_tasks(plan.skip(tasks, start * self.batch_size), self.timeout), self.batch_size)
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
        """The slot's epoch, mixed across shards and block-shuffled, from position `start` on."""
        block = self.shuffle_block
        if block <= 1:
            yield from self._mixed(tasks, start)
            return
        first = start // block
        samples = self._mixed(tasks, first * block)
        for b in count(first):
            chunk = list(islice(samples, block))
            if not chunk:
                return
            perm = plan.block_permutation(self.seed, self.restart, epoch, slot, b, len(chunk))
            chunk = [chunk[i] for i in perm]
            yield from (chunk[start - first * block:] if b == first else chunk)


    def _mixed(self, tasks: list[plan.ReadTask], start: int) -> Iterator[dict | Corrupt]:
        """The tasks read `mix_shards` at a time side by side (`plan.mix_order`), from position `start` on."""
        order = plan.mix_order(tasks, self.mix_shards)
        done = plan.mix_offsets(order, start, len(tasks))
        readers: dict[int, Iterator] = {}
        for i in order[start:].tolist():
            if i not in readers:
                task = tasks[i]
                readers[i] = read_shard(plan.ReadTask(task.shard, task.start + int(done[i]), task.stop), self.timeout)
            yield next(readers[i])
            done[i] += 1
            if done[i] == len(tasks[i]):
                readers.pop(i).close()  # release the file or connection now, not at the end of the epoch


def _named_timeout(batches: Iterator[dict], where: str, timeout_s: float) -> Iterator[dict]:
    """The DataLoader's batches; its timeout as one `TimeoutError` naming the data and the key that sets it."""
    try:
        yield from batches
    except RuntimeError as exn:
        if "DataLoader timed out" not in str(exn):
            raise
        raise TimeoutError(f"the data workers of {where} delivered no batch for {timeout_s:g} s (a stalled or very "
                           f"slow source; the bound follows data.io_timeout_s)") from None


def _chunks(samples: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(samples, size)):
        yield chunk


def read_tasks(tasks: list[plan.ReadTask], timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[dict | Corrupt]:
    """Samples of the tasks, in order: exactly ``len(task)`` items per task, `Corrupt` for any not delivered."""
    for task in tasks:
        yield from read_shard(task, timeout_s)


def read_shard(task: plan.ReadTask, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[dict | Corrupt]:
    """Samples [start, stop) of the shard at URL ``task.shard``: exactly ``len(task)`` items.

    A network shard whose read fails midway is reopened up to `NETWORK_RETRIES` times, skipping what was
    already delivered; what still cannot be read becomes `Corrupt` placeholders naming the error."""
    position, last_key, error = 0, None, "the tar has fewer samples than its count says"
    retries = NETWORK_RETRIES if local_path(task.shard) is None else 0  # a damaged local file stays damaged
    for attempt in range(retries + 1):
        seen = 0  # samples of this attempt's read
        try:
            with open_url(task.shard, timeout_s) as f:
                for sample in complete_samples(task.shard, f):
                    seen += 1
                    if seen <= position:
                        continue  # delivered by an earlier attempt
                    if position >= task.stop:
                        break
                    if position >= task.start:
                        yield sample
                    last_key, position = sample["__key__"], position + 1
            if position >= task.stop:
                break
            error = "the tar has fewer samples than its count says"  # or a connection that ended early
        except PermanentShardError as exn:  # 404, 403, no such file: reopening cannot help
            error = str(exn)
            break
        except Exception as exn:  # truncated or unreadable tar: what was read stays valid
            error = f"{type(exn).__name__}: {exn}"
        if attempt < retries and position < task.stop:
            log.warning("reading shard %s failed after %d samples (%s); reopening it (%d/%d)", task.shard,
                        position, error, attempt + 1, retries)
            time.sleep(0.5 * (attempt + 1))
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
