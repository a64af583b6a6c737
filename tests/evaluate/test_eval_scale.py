"""eigtrain-eval at 60,000 vectors (issue 50): the memory-bound steps work in blocks and give what one block gave,
and long evaluations say which step runs. The figures at full scale: tools/bench_eval_scale.py."""

from __future__ import annotations

import io

import torch

from eigtrain.evaluate.probes import probe_accuracy
from eigtrain.evaluate.progress import StepProgress
from eigtrain.evaluate.table import _draws_until, _subset_accuracy, random_subsets
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
    draws = random_subsets(10, [4], 7, seed=0)[4]
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


def test_random_subsets_at_full_width_are_one_draw_and_the_probe_ignores_the_coordinate_order():
    """k = d: every subset is every coordinate; the whitened probe scores each order alike, so one draw is the mean."""
    subsets = random_subsets(10, [4, 10], 7, seed=0)
    assert subsets[4].shape == (7, 4) and subsets[10].shape == (1, 10)
    (train, train_y), (test, test_y) = _data(400, 10), _data(200, 10, seed=1)
    orders = torch.stack([torch.randperm(10, generator=torch.Generator().manual_seed(s)) for s in range(3)])
    acc = lambda tr, te: probe_accuracy(tr, train_y, te, test_y, probe="sgd", epochs=3)  # noqa: E731
    scores = _subset_accuracy(train, test, orders, acc)
    assert (scores - scores[0]).abs().max() <= 1 / 200  # float rounding may move one borderline sample at most


def test_random_subsets_draw_until_the_mean_is_known():
    """RS scores `group` draws at a time and stops once the standard error of their mean is small enough."""
    train = torch.zeros(3, 50)
    train[0] = torch.linspace(0, 1, 50)  # a draw's fake score: the first training value of its first coordinate
    first = lambda tr, te: tr[:, 0, 0]  # noqa: E731
    draws = torch.stack([torch.randperm(50, generator=torch.Generator().manual_seed(s))[:4] for s in range(50)])
    assert len(_draws_until(train, train, draws, first, se=0)) == 50  # 0: every draw
    assert len(_draws_until(train, train, draws, first, se=1.0)) == 5  # a loose target: the first group
    spread = _draws_until(train, train, draws, first, se=0.05)  # scores spread over 0..1: ~0.3 / sqrt(n) needs ~40
    assert 25 <= len(spread) < 50 and len(spread) % 5 == 0
    assert (spread.std() / len(spread) ** 0.5 <= 0.05) and (spread[:-5].std() / (len(spread) - 5) ** 0.5 > 0.05)
    flat = torch.ones(3, 50)
    assert len(_draws_until(flat, flat, draws, first, se=1e-9)) == 5  # equal scores: the mean is exact at once
