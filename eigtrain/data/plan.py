"""Which samples each (rank, worker) reads, in which order: pure functions of the index, the seed and the cursor.

Terms. A *slot* is one DataLoader worker of one rank: ``slot = rank * num_workers + worker``, ``S = world_size *
num_workers`` slots in all. Every slot produces its own stream of batches; the DataLoader interleaves the streams
of one rank's workers round-robin. The cursor of a rank is the number of batches it has handed out; from it,
`round_robin_resume` recovers how far each of its slots got, which is all a resumed run needs.

Training epoch ``e`` (not resampled): the shard list is shuffled by (seed, restart, e) and read as one
concatenated sample stream; rank r takes a contiguous range of it (split by node), and its workers take equal
sub-ranges (split by worker). Every slot gets exactly ``L = samples_per_slot`` samples, a whole number of batches,
so every rank yields the same number of batches and no DDP step waits for a rank that ran dry. The few samples
past ``S * L`` (fewer than one global batch) are left out of that epoch; the shuffle drops different ones each
epoch. A slot reads whole shards except at its two ends.

Resampled epoch: each slot draws shards with replacement (probability proportional to their size) from its own
seeded stream until it has ``L`` samples.

One pass (``one_pass=True``): the sorted shards, split into S nearly equal contiguous ranges, nothing dropped.

Within a slot's epoch the samples are first *mixed across shards*: the slot's read tasks are taken in groups of
``mix_shards`` consecutive tasks that are read side by side, interleaved in proportion to their lengths
(`mix_order`), so shards written class by class still give batches of many classes. Then the mixed stream is
shuffled in blocks of ``shuffle_block`` (a seeded permutation per block), before decoding. Both steps are pure
functions of the task list, so resuming at position p costs reading the block that holds p, not replaying a
shuffle buffer: how far each task got by then is a count over the mix order (`mix_offsets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import numpy as np

# tags that keep the random streams of different purposes apart
_SHARD_ORDER, _RESAMPLE, _BLOCK = 1, 2, 3


@dataclass(frozen=True)
class ReadTask:
    """Read samples [start, stop) of a shard, in stored order."""

    shard: str
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng([int(p) for p in parts])


def samples_per_slot(num_samples: int, num_slots: int, batch_size: int) -> int:
    """Samples every slot reads per training epoch: equal for all slots and a whole number of batches."""
    return (num_samples // num_slots) // batch_size * batch_size


def concat_range(shards: list[tuple[str, int]], start: int, stop: int) -> list[ReadTask]:
    """ReadTasks covering positions [start, stop) of the concatenation of `shards` (name, count)."""
    tasks = []
    ends = list(accumulate(n for _, n in shards))
    for (name, n), end in zip(shards, ends):
        begin = end - n
        lo, hi = max(start, begin), min(stop, end)
        if lo < hi:
            tasks.append(ReadTask(name, lo - begin, hi - begin))
    return tasks


def skip(tasks: list[ReadTask], count: int) -> list[ReadTask]:
    """Drop the first `count` samples of a task list without reading anything."""
    out = []
    for task in tasks:
        if count >= len(task):
            count -= len(task)
            continue
        out.append(ReadTask(task.shard, task.start + count, task.stop))
        count = 0
    return out


def epoch_shard_order(shards: list[tuple[str, int]], seed: int, restart: int, epoch: int) -> list[tuple[str, int]]:
    order = rng(seed, restart, epoch, _SHARD_ORDER).permutation(len(shards))
    return [shards[i] for i in order]


def train_epoch_tasks(
    shards: list[tuple[str, int]],
    slot: int,
    num_slots: int,
    per_slot: int,
    seed: int,
    restart: int,
    epoch: int,
    resampled: bool,
) -> list[ReadTask]:
    """The `per_slot` samples of `slot` in training epoch `epoch`."""
    if not resampled:
        ordered = epoch_shard_order(shards, seed, restart, epoch)
        return concat_range(ordered, slot * per_slot, (slot + 1) * per_slot)
    counts = np.array([n for _, n in shards], dtype=np.float64)
    weights = counts / counts.sum()
    gen = rng(seed, restart, epoch, slot, _RESAMPLE)
    tasks, total = [], 0
    while total < per_slot:
        name, n = shards[gen.choice(len(shards), p=weights)]
        take = min(n, per_slot - total)
        if take:
            tasks.append(ReadTask(name, 0, take))
            total += take
    return tasks


def one_pass_tasks(shards: list[tuple[str, int]], slot: int, num_slots: int) -> list[ReadTask]:
    """Slot `slot`'s share of a single pass: every sample read by exactly one slot, nothing dropped."""
    total = sum(n for _, n in shards)
    return concat_range(shards, slot * total // num_slots, (slot + 1) * total // num_slots)


def mix_order(tasks: list[ReadTask], width: int) -> np.ndarray:
    """Which task each position of the slot's mixed stream reads from (its next sample, in stored order).

    Tasks are taken in consecutive groups of at most `width` (as equal in number as possible); within a group
    sample j of task i is placed at time (j + 0.5) / len(task i), so the group's tasks are read side by side
    and end together.
    """
    lengths = np.array([len(t) for t in tasks], dtype=np.int64)
    if width <= 1 or len(tasks) <= 1:
        return np.repeat(np.arange(len(tasks)), lengths)
    order = []
    for group in np.array_split(np.arange(len(tasks)), -(-len(tasks) // width)):
        owner = np.repeat(group, lengths[group])
        rank_in_task = np.concatenate([np.arange(n) for n in lengths[group]]) if len(owner) else owner
        time = (rank_in_task + 0.5) / lengths[owner]
        order.append(owner[np.lexsort((owner, time))])
    return np.concatenate(order) if order else np.zeros(0, dtype=np.int64)


def mix_offsets(order: np.ndarray, position: int, num_tasks: int) -> np.ndarray:
    """How many samples of each task the mixed stream has read before `position`."""
    return np.bincount(order[:position], minlength=num_tasks)


def block_permutation(seed: int, restart: int, epoch: int, slot: int, block: int, size: int) -> np.ndarray:
    return rng(seed, restart, epoch, slot, block, _BLOCK).permutation(size)


def round_robin_resume(batches: int, per_worker: list[int] | None, num_workers: int) -> tuple[list[int], int]:
    """How many batches each worker of a rank had produced after the rank handed out `batches`, and which
    worker is next.

    The DataLoader takes batches from workers 0, 1, ..., W-1, 0, ... and skips a worker once it is exhausted.
    `per_worker` is each worker's total number of batches (None: endless, as in training mode). A resumed
    DataLoader starts at its worker 0 again, so the stream makes its worker j play logical worker
    ``(j + next) % W``; with the counts consumed per worker this reproduces the uninterrupted order exactly.
    """
    if per_worker is None:
        return [batches // num_workers + (w < batches % num_workers) for w in range(num_workers)], batches % num_workers
    if batches > sum(per_worker):
        raise ValueError(f"cursor at batch {batches} but this rank only has {sum(per_worker)} batches")
    taken, w = [0] * num_workers, 0
    for _ in range(batches):
        while taken[w] >= per_worker[w]:
            w = (w + 1) % num_workers
        taken[w] += 1
        w = (w + 1) % num_workers
    return taken, w
