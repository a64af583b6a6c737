"""The read plan: which slot reads which samples, and how a cursor maps back to per-worker positions."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from eigtrain.data import plan


def random_shards(seed, n_shards=7):
    rng = np.random.default_rng(seed)
    return [(f"s{i:02d}.tar", int(n)) for i, n in enumerate(rng.integers(1, 40, n_shards))]


def expand(tasks):
    return [(t.shard, i) for t in tasks for i in range(t.start, t.stop)]


def test_concat_range_and_skip():
    shards = [("a", 3), ("b", 5), ("c", 2)]
    assert plan.concat_range(shards, 2, 9) == [
        plan.ReadTask("a", 2, 3),
        plan.ReadTask("b", 0, 5),
        plan.ReadTask("c", 0, 1),
    ]
    tasks = plan.concat_range(shards, 0, 10)
    assert expand(plan.skip(tasks, 4)) == expand(tasks)[4:]
    assert plan.skip(tasks, 10) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("slots,batch", [(1, 4), (4, 3), (6, 1)])
def test_training_epoch_slots_are_disjoint_equal_and_drop_less_than_a_global_batch(seed, slots, batch):
    shards = random_shards(seed)
    total = sum(n for _, n in shards)
    per_slot = plan.samples_per_slot(total, slots, batch)
    seen = []
    for slot in range(slots):
        tasks = plan.train_epoch_tasks(shards, slot, slots, per_slot, seed=3, restart=0, epoch=1, resampled=False)
        assert sum(map(len, tasks)) == per_slot and per_slot % batch == 0
        seen += expand(tasks)
    assert len(set(seen)) == len(seen) == slots * per_slot
    assert total - len(seen) < slots * batch
    other_epoch = [expand(plan.train_epoch_tasks(shards, s, slots, per_slot, 3, 0, 2, False)) for s in range(slots)]
    assert sum(other_epoch, []) != seen  # the shard order is reshuffled every epoch


@pytest.mark.parametrize("seed", range(5))
def test_one_pass_reads_every_sample_exactly_once(seed):
    shards = random_shards(seed)
    seen = sum((expand(plan.one_pass_tasks(shards, s, 5)) for s in range(5)), [])
    assert sorted(seen) == sorted((name, i) for name, n in shards for i in range(n))


def test_resampled_tasks_have_the_slot_length_and_depend_on_the_seed():
    shards = random_shards(0, n_shards=20)
    tasks = plan.train_epoch_tasks(shards, 0, 4, 60, seed=0, restart=0, epoch=0, resampled=True)
    assert sum(map(len, tasks)) == 60
    assert tasks == plan.train_epoch_tasks(shards, 0, 4, 60, 0, 0, 0, True)
    assert tasks != plan.train_epoch_tasks(shards, 0, 4, 60, 0, 1, 0, True)  # restart counter reshuffles
    assert tasks != plan.train_epoch_tasks(shards, 1, 4, 60, 0, 0, 0, True)  # every slot draws its own


class _Tagged(IterableDataset):
    """Worker w yields (w, 0), (w, 1), ... counts[w] items; with a rotation, as ShardStream's workers do."""

    def __init__(self, counts, starts=None, rotation=0):
        self.counts, self.rotation = counts, rotation
        self.starts = starts or [0] * len(counts)

    def __iter__(self):
        w = (get_worker_info().id + self.rotation) % len(self.counts)
        return iter([torch.tensor([w, i]) for i in range(self.starts[w], self.counts[w])])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("counts", [[3, 3], [1, 4, 2]])
def test_round_robin_resume_reproduces_the_real_dataloader_order(counts):
    """The resume arithmetic rests on the DataLoader's order; check it against a real DataLoader."""
    order = [tuple(x.tolist()) for x in DataLoader(_Tagged(counts), batch_size=None, num_workers=len(counts))]
    assert len(order) == sum(counts)
    for done in (1, sum(counts) - 2):
        starts, rotation = plan.round_robin_resume(done, counts, len(counts))
        assert starts == [sum(1 for w, _ in order[:done] if w == k) for k in range(len(counts))]
        resumed = DataLoader(_Tagged(counts, starts, rotation), batch_size=None, num_workers=len(counts))
        assert [tuple(x.tolist()) for x in resumed] == order[done:]


def test_round_robin_resume_endless_workers():
    assert plan.round_robin_resume(7, None, 3) == ([3, 2, 2], 1)


def test_mix_order_reads_groups_of_tasks_side_by_side_in_stored_order():
    tasks = [plan.ReadTask(f"s{i}", 0, n) for i, n in enumerate([4, 8, 2, 6, 6])]
    order = plan.mix_order(tasks, 3)
    assert sorted(order.tolist()) == sorted(i for i, t in enumerate(tasks) for _ in range(len(t)))
    first_group = order[:14].tolist()  # 5 tasks, width 3: groups {0, 1, 2} then {3, 4}
    assert set(first_group) == {0, 1, 2} and set(order[14:].tolist()) == {3, 4}
    assert len(set(first_group[:4])) == 3  # all of the group's tasks start at once (proportional to length)
    for p in (0, 5, 14, 19, 26):
        offsets = plan.mix_offsets(order, p, len(tasks))
        assert offsets.sum() == p and all(offsets[i] == (order[:p] == i).sum() for i in range(len(tasks)))
    assert plan.mix_order(tasks, 1).tolist() == [i for i, t in enumerate(tasks) for _ in range(len(t))]
