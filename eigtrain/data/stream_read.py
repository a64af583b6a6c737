"""What runs inside each DataLoader worker of a ShardStream: plan -> read -> shuffle -> decode -> batch.

Kept apart from the stream (arguments, cursor, main-process side) because this is the part that is pickled
into the workers and reads the shards; it depends only on the stream's plan, never on a process group.
"""

from __future__ import annotations

import logging
import time
from itertools import count, islice
from typing import Generator, Iterator

from torch.utils.data import IterableDataset, get_worker_info

from eigtrain.data import plan
from eigtrain.data.decode import Corrupt, collate, decode_sample
from eigtrain.data.shards import DEFAULT_TIMEOUT_S, PermanentShardError, complete_samples, local_path, open_url

log = logging.getLogger(__name__)

NETWORK_RETRIES = 2  # reopenings of a network shard whose read failed midway


class WorkerPipeline(IterableDataset):
    """What runs inside each DataLoader worker: plan -> read -> shuffle -> decode -> batch."""

    def __init__(self, stream, starts: list[int], rotation: int):
        self.shards, self.spec, self.mix_shards = stream.shards, stream.spec, stream.mix_shards
        self.timeout = stream.io_timeout_s
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
        per_slot = self.per_slot
        assert per_slot is not None  # set whenever one_pass is off (__init__)
        per_epoch = per_slot // self.batch_size
        epoch, first = divmod(start, per_epoch)
        for epoch in count(epoch):
            tasks = plan.train_epoch_tasks(
                self.shards, slot, self.num_slots, per_slot, self.seed, self.restart, epoch, self.resampled
            )
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
            yield from (chunk[start - first * block :] if b == first else chunk)

    def _mixed(self, tasks: list[plan.ReadTask], start: int) -> Iterator[dict | Corrupt]:
        """The tasks read `mix_shards` at a time side by side (`plan.mix_order`), from position `start` on."""
        order = plan.mix_order(tasks, self.mix_shards)
        done = plan.mix_offsets(order, start, len(tasks))
        readers: dict[int, Generator[dict | Corrupt, None, None]] = {}
        for i in order[start:].tolist():
            if i not in readers:
                task = tasks[i]
                readers[i] = read_shard(plan.ReadTask(task.shard, task.start + int(done[i]), task.stop), self.timeout)
            yield next(readers[i])
            done[i] += 1
            if done[i] == len(tasks[i]):
                readers.pop(i).close()  # release the file or connection now, not at the end of the epoch


def _chunks(samples: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(samples, size)):
        yield chunk


def read_tasks(tasks: list[plan.ReadTask], timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[dict | Corrupt]:
    """Samples of the tasks, in order: exactly ``len(task)`` items per task, `Corrupt` for any not delivered."""
    for task in tasks:
        yield from read_shard(task, timeout_s)


def read_shard(task: plan.ReadTask, timeout_s: float = DEFAULT_TIMEOUT_S) -> Generator[dict | Corrupt, None, None]:
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
            log.warning(
                "reading shard %s failed after %d samples (%s); reopening it (%d/%d)",
                task.shard,
                position,
                error,
                attempt + 1,
                retries,
            )
            time.sleep(0.5 * (attempt + 1))
    for missing in range(max(position, task.start), task.stop):
        where = f"sample #{missing} (after key {last_key!r})" if last_key else f"sample #{missing}"
        yield Corrupt(task.shard, where, f"not readable from the shard: {error}")


def named_timeout(batches: Iterator[dict], where: str, timeout_s: float) -> Iterator[dict]:
    """The DataLoader's batches; its timeout as one `TimeoutError` naming the data and the key that sets it."""
    try:
        yield from batches
    except RuntimeError as exn:
        if "DataLoader timed out" not in str(exn):
            raise
        raise TimeoutError(
            f"the data workers of {where} delivered no batch for {timeout_s:g} s (a stalled or very "
            f"slow source; the bound follows data.io_timeout_s)"
        ) from None
