"""eigtrain-eval at 60,000 vectors (issue 50): the memory-bound steps work in blocks and give what one block gave,
and long evaluations say which step runs. The figures at full scale: tools/bench_eval_scale.py."""

from __future__ import annotations

import io

import torch

from eigtrain.evaluate.probes import probe_accuracy
from eigtrain.evaluate.progress import StepProgress
from eigtrain.evaluate.table import _random_subsets, _subset_accuracy
from eigtrain.train.knn import knn_accuracy


def _data(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, d, generator=g) + torch.nn.functional.one_hot(y, d).float() * 2
    return x, y


def test_knn_in_blocks_of_test_rows_equals_one_block():
    (a, ya), (b, yb) = _data(900, 12), _data(333, 12, seed=1)
    whole = knn_accuracy(a, ya, b, yb, block_elements=1 << 40)
    assert knn_accuracy(a, ya, b, yb, block_elements=900 * 7) == whole  # 7 test rows per block, a ragged last one
    assert knn_accuracy(a, ya, b, yb, block_elements=1) == whole  # one row per block


def test_random_subset_probes_in_groups_equal_all_at_once():
    (train, train_y), (test, test_y) = _data(400, 10), _data(100, 10, seed=1)
    draws = _random_subsets(10, [4], 7, seed=0)[4]
    acc = lambda tr, te: probe_accuracy(tr, train_y, te, test_y, probe="sgd", epochs=3)  # noqa: E731
    together = _subset_accuracy(train, test, draws, acc, budget_bytes=1 << 40)
    grouped = _subset_accuracy(train, test, draws, acc, budget_bytes=4 * 500 * 4 * 2)  # two draws per group
    assert together.shape == (7,) and torch.equal(grouped, together)


def test_progress_is_silent_on_short_evaluations_and_names_each_step_on_long_ones():
    quiet, loud = io.StringIO(), io.StringIO()
    StepProgress(2, quiet_s=60, stream=quiet).step("PCA probe at k=4")
    progress = StepProgress(2, quiet_s=0, stream=loud)
    progress.step("PCA probe at k=4")
    progress.step("RS probes at k=8 (50 random subsets)")
    assert quiet.getvalue() == ""
    lines = loud.getvalue().splitlines()
    assert lines[0].startswith("eigtrain-eval: [1/2] PCA probe at k=4 (") and "[2/2] RS probes at k=8" in lines[1]
