"""The exact reduction across ranks: all-reducing the moment matrices or all-gathering the features gives the
same loss and gradients (two gloo processes, ragged batches included), and the rule picks the cheaper."""

import itertools
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from eigtrain.objectives import build_objective
from eigtrain.objectives.moments import choose_reduction, reduction_costs
from eigtrain.schema import objective_schema
from tests.objectives.test_objectives_distributed import CASES, DIM, WORLD, _data, _model, _Pair
from tests.support.runs import check, free_port, losses, overrides, torchrun

# Per-rank batches: equal, and ragged (a short last batch; even, as split-batch objectives need).
SIZES = {"equal": [8, 8], "ragged": [8, 6]}
# reduction option -> (objective keywords, the route it must take on these tiny batches)
ROUTES = {
    "moments": ({"reduction": "moments"}, "moments"),
    "gather": ({"reduction": "gather"}, "gather"),
    "auto, cheap compute": ({"reduction": "auto", "reduction_flops_per_byte": 1e9}, "gather"),
    "auto, dear compute": ({"reduction": "auto", "reduction_flops_per_byte": 1e-3}, "moments"),
}
# (equal, moments) is tests/objectives/test_objectives_distributed.py
RUNS = [("equal", "gather")] + [("ragged", route) for route in ROUTES]


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    x, a = _data()
    results = []
    for label, route_name in RUNS:
        sizes, (options, _) = SIZES[label], ROUTES[route_name]
        start = sum(sizes[:rank])
        rows = slice(start, start + sizes[rank])
        for name, kwargs, nesting in CASES:
            objective = build_objective(name, DIM, nesting=nesting, **kwargs, **options)
            encoders = _model(objective.pairs)
            ddp = DDP(_Pair(encoders))  # kept alive until backward has averaged the gradients
            z1, z2 = ddp(x[rows], a[rows])
            loss, terms = objective(z1, z2)
            loss.backward()
            grads = [p.grad.detach().clone() for p in encoders.parameters()]
            results.append((objective.last_route, loss.detach(), terms["eigenvalues"], grads))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_route_gives_the_single_process_loss_and_gradients(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    x, a = _data()
    i = 0
    for label, route_name in RUNS:
        rows, route = slice(0, sum(SIZES[label])), ROUTES[route_name][1]
        for name, kwargs, nesting in CASES:
            objective = build_objective(name, DIM, nesting=nesting, distributed=False, **kwargs)
            encoders = _model(objective.pairs)
            loss, terms = objective(encoders[0](x[rows]), encoders[-1](a[rows]))
            loss.backward()
            grads = [p.grad for p in encoders.parameters()]
            case = f"{name} {kwargs} nesting={nesting} {label} batches, reduction {route_name}"
            for taken, rank_loss, eigenvalues, rank_grads in (r[i] for r in ranks):
                assert taken == route, case
                torch.testing.assert_close(rank_loss, loss.detach(), rtol=1e-10, atol=1e-12, msg=case)
                torch.testing.assert_close(eigenvalues, terms["eigenvalues"], rtol=1e-10, atol=1e-12, msg=case)
                for got, want in zip(rank_grads, grads):
                    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=case)
            i += 1


def _scl_stats(d: int) -> int:
    return 2 * d * d  # P and Q (the d-vectors are negligible)


def test_the_issue_example_one_matrix_is_twice_the_gathered_features():
    d, batch = 8192, 4096
    assert d * d == 2 * batch * d  # 67 M numbers against 34 M


def test_small_dimensions_all_reduce_the_moments():
    for d in (128, 256, 512):
        assert choose_reduction(_scl_stats(d), 2 * d, [512] * 8, 4, 1000.0) == "moments"


def test_large_dimensions_gather_unless_the_extra_compute_outweighs_the_bytes():
    d = 8192
    # 64 ranks, global batch 1,024: every rank computing all 1,024 rows costs less than all-reducing 2 d^2 floats.
    assert choose_reduction(_scl_stats(d), 2 * d, [16] * 64, 4, 1000.0) == "gather"
    # 8 ranks, global batch 4,096: fewer bytes to gather (2x), but 8x the Gram flops per rank: moments win.
    assert choose_reduction(_scl_stats(d), 2 * d, [512] * 8, 4, 1000.0) == "moments"
    # The same with free compute: bytes alone decide, and gathering moves fewer.
    assert choose_reduction(_scl_stats(d), 2 * d, [512] * 8, 4, 1e12) == "gather"


def test_costs_follow_the_ring_formulas():
    costs = reduction_costs(stat_numel=100, width=10, rows=[3, 5], element_size=4, flops_per_byte=1e300)
    assert costs["moments"] == pytest.approx(2 * (2 - 1) / 2 * 100 * 4)  # 2(W-1)/W S bytes
    assert costs["gather"] == pytest.approx((2 - 1) * 5 * 10 * 4)  # (W-1) batches, padded to the largest
    compute = reduction_costs(stat_numel=100, width=10, rows=[3, 5], element_size=4, flops_per_byte=1.0)
    assert compute["moments"] - costs["moments"] == pytest.approx(2 * 100 * 5)  # the largest rank's rows
    assert compute["gather"] - costs["gather"] == pytest.approx(2 * 100 * 8)  # every row


def test_the_closed_form_of_the_readme_whatever_the_world_size():
    """Equal batches, 2 d^2 stats, fp32: gather iff the global batch B < 1 / (1/(2d) + 1/(4 flops_per_byte))."""
    for d, world, fpb, batch in itertools.product((64, 512, 8192), (2, 8, 1024), (10.0, 125.0, 1e3), (2048, 4096)):
        threshold = 1.0 / (1.0 / (2 * d) + 1.0 / (4 * fpb))
        for b in (batch, round(threshold * 0.97), round(threshold * 1.03)):
            local = max(b // world, 2)
            expected = "gather" if local * world < threshold else "moments"
            assert choose_reduction(_scl_stats(d), 2 * d, [local] * world, 4, fpb) == expected, (d, world, fpb, b)


def test_gather_losing_at_the_smallest_batch_loses_at_any():
    """What lets 'auto' skip the size exchange: gathering only gets dearer with every row on any rank."""
    for d, world, fpb in itertools.product((16, 64, 256, 1024), (2, 3, 8), (10.0, 1e3, 1e5)):
        smallest = [2] * world
        if choose_reduction(_scl_stats(d), 2 * d, smallest, 4, fpb) == "moments":
            for rows in ([2] * (world - 1) + [100], [7] * world, [64] * world):
                assert choose_reduction(_scl_stats(d), 2 * d, rows, 4, fpb) == "moments", (d, world, fpb, rows)


def test_the_reduction_is_a_typed_objective_key_with_its_default_and_checked():
    fields = {f.name: f.default for f in objective_schema("rq").__dataclass_fields__.values()}
    assert fields["reduction"] == "auto" and fields["reduction_flops_per_byte"] == 125.0
    with pytest.raises(ValueError, match=r"^reduction='scatter' is unknown; allowed: auto, moments, gather$"):
        build_objective("rq", 8, reduction="scatter")
    with pytest.raises(ValueError, match="reduction_flops_per_byte must be positive"):
        build_objective("scl", 8, reduction_flops_per_byte=0)
    assert build_objective("vicreg", 8).reduction == "auto"


def test_every_objective_config_takes_the_reduction_keys_without_a_plus():
    from eigtrain.objectives import OBJECTIVES, Objective
    from eigtrain.train.checks import validate
    from eigtrain.train.command import compose_config

    for name in OBJECTIVES:  # every option file holds the keys, with the class defaults (its schema's)
        composed = compose_config([f"objective={name}"]).objective
        assert {k: composed[k] for k in Objective.options} == Objective.options, name
    cfg = compose_config(["objective=rq", "objective.reduction=gather", "objective.reduction_flops_per_byte=1e3"])
    validate(cfg, world_size=2)
    assert (cfg.objective.reduction, cfg.objective.reduction_flops_per_byte) == ("gather", 1e3)


@pytest.mark.slow
def test_two_rank_training_is_the_same_through_either_route(digits_root, tmp_path):
    """The trainer's path (DDP, engine, skip bookkeeping) with the features gathered: the losses of 4 fp32 steps
    match those with the moments all-reduced (the sums are only added in another order)."""
    runs = {}
    for route in ("moments", "gather"):
        run_dir = tmp_path / route
        check(
            torchrun(
                tmp_path,
                ["-m", "eigtrain.train.command"],
                *overrides(
                    run_dir,
                    digits_root,
                    "steps=4",
                    "checkpoint_every=4",
                    "objective=rq",
                    f"objective.reduction={route}",
                ),
            )
        )
        runs[route] = losses(run_dir)
    assert [s for s, _ in runs["gather"]] == [s for s, _ in runs["moments"]] == [1, 2, 3, 4]
    for (_, gathered), (_, reduced) in zip(runs["gather"], runs["moments"]):
        assert gathered == pytest.approx(reduced, rel=1e-4, abs=1e-5)


def test_one_process_takes_no_collective():
    objective = build_objective("scl", 4, reduction="gather")
    objective(torch.randn(6, 4), torch.randn(6, 4))
    assert objective.last_route == "moments"  # nothing to reduce: the local sums are the global ones
