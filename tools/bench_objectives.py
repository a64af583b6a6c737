"""Benchmark the objectives: cost of nesting, masked vs per-prefix loop, communication volume.

    python tools/bench_objectives.py [--dim 512] [--batch 4096] [--repeats 5] [--skip-naive]

Prints JSON. Times are medians of interleaved forward+backward runs measured side by side in one
process, so the ratios are meaningful on a noisy shared machine; absolute times are not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from unittest import mock

import torch

from eigtrain.objectives import base as objective_base
from eigtrain.objectives import build_objective


def _fwd_bwd(objective, f, g):
    f.grad = g.grad = None
    loss, _ = objective(f, g)
    loss.backward()


def _naive_loop(name, dim, f, g):
    """The brute-force nested loss: one un-nested objective per prefix, summed."""
    f.grad = g.grad = None
    total = 0.0
    for k in range(1, dim + 1):
        total = total + build_objective(name, k, distributed=False)(f[:, :k], g[:, :k])[0] / dim
    total.backward()


def _time(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _reduced_floats(objective, f, g) -> int:
    """Number of floats the objective all-reduces per step (captured from its reduction call)."""
    sizes = []

    def capture(stats, enabled=True):
        sizes.append(sum(t.numel() for t in stats.values()))
        return stats

    with mock.patch.object(objective_base, "all_reduce_sum", capture):
        objective(f.detach(), g.detach())
    return sum(sizes)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    f = torch.randn(args.batch, args.dim, requires_grad=True)
    g = (f.detach() + 0.1 * torch.randn_like(f)).requires_grad_()
    out = {"dim": args.dim, "batch": args.batch, "threads": torch.get_num_threads(), "families": {}}

    for name in ("lora", "rq"):
        plain = build_objective(name, args.dim, distributed=False)
        nested = build_objective(name, args.dim, nesting="joint", distributed=False)
        _fwd_bwd(plain, f, g), _fwd_bwd(nested, f, g)  # warm-up
        t_plain, t_nested = [], []
        for _ in range(args.repeats):  # interleave so both see the same machine load
            t_plain += _time(lambda: _fwd_bwd(plain, f, g), 1)
            t_nested += _time(lambda: _fwd_bwd(nested, f, g), 1)
        res = {
            "unnested_s": statistics.median(t_plain),
            "nested_s": statistics.median(t_nested),
        }
        res["nested_over_unnested"] = res["nested_s"] / res["unnested_s"]
        if not args.skip_naive:
            t_naive = _time(lambda: _naive_loop(name, args.dim, f, g), 1)[0]
            res["naive_loop_s"] = t_naive
            res["naive_over_masked"] = t_naive / res["nested_s"]

        # Communication per step at world size W: ring all-reduce moves 2(W-1)/W of the buffer per rank;
        # gathering both views' features moves (W-1)/W of the global feature matrix per rank.
        floats = _reduced_floats(nested, f, g)
        w = args.world
        allreduce_bytes = 2 * (w - 1) / w * floats * 4
        allgather_bytes = (w - 1) / w * 2 * args.batch * args.dim * 4
        res.update(
            moment_floats=floats,
            allreduce_bytes_per_rank=allreduce_bytes,
            allgather_features_bytes_per_rank=allgather_bytes,
            allgather_over_allreduce=allgather_bytes / allreduce_bytes,
        )
        out["families"][name] = res
    out["goals"] = {"nested_over_unnested": "<= 1.15", "naive_over_masked": ">= 20"}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
