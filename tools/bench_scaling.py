"""The objective's cross-rank cost against d, global batch and world size: all-reduce the moments or gather.

    python tools/bench_scaling.py [--dims 128,...,8192] [--local-batches 16,128] [--repeats 3] [--markdown FILE]

Measured: two gloo processes on CPU (one thread each), one forward+backward of `scl` (normalize=full) per
route, both routes interleaved in the same run, so the ratios mean something on a shared machine; also the
bare collectives (all-reduce of the stats, all-gather of the features) and the compute alone (the same
objective without a process group on the local and on the global batch). Modeled: NCCL ring formulas for
8-1,024 H100s with the bandwidths of benchmarks/scaling.md. Prints JSON (--markdown: also the tables, to FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from eigtrain.objectives import build_objective
from eigtrain.objectives.moments import choose_reduction, reduction_costs

WORLD = 2
# Modeled machine (benchmarks/scaling.md says where each number comes from).
H100_FP32_FLOPS = 50e12  # sustained IEEE fp32 GEMM; datasheet peak 67 TFLOP/s
BUS_BW = {"nvswitch": 450e9, "ndr_8nic": 360e9, "ndr_1nic": 45e9}  # NCCL busbw, bytes/s
LATENCY = {"nvswitch": 2e-6, "ndr_8nic": 5e-6, "ndr_1nic": 5e-6}  # per ring step (assumed)


def stat_numel(name: str, dim: int, **kwargs) -> int:
    """Numbers the objective all-reduces per step (counted on the meta device: nothing is allocated)."""
    objective = build_objective(name, dim, distributed=False, **kwargs).to("meta")
    z = torch.empty(4, dim, device="meta")
    f, g, ctx = objective.prepare(z, z)
    return sum(v.numel() for v in objective.local_stats(f, g, ctx).values())


# ---------------------------------------------------------------------------------------------- measured


def _timed(fn, repeats: int) -> float:
    """Median seconds of fn over ranks' slowest (a barrier before, the max over ranks after)."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return statistics.median(times)


def _fwd_bwd(objective, f, g):
    f.grad = g.grad = None
    objective(f, g)[0].backward()


def _measure_point(dim: int, local: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(dist.get_rank())
    f, g = (torch.randn(local, dim, generator=gen).requires_grad_() for _ in range(2))
    big = [torch.randn(WORLD * local, dim, generator=gen).requires_grad_() for _ in range(2)]
    numel = stat_numel("scl", dim, normalize="full")
    step = {}
    for route in ("moments", "gather"):  # one objective per route, measured back to back
        objective = build_objective("scl", dim, normalize="full", reduction=route)
        step[route] = _timed(lambda: _fwd_bwd(objective, f, g), repeats)
    flat, rows = torch.zeros(numel), torch.zeros(local, 2 * dim)
    parts = [torch.empty_like(rows) for _ in range(WORLD)]
    alone = build_objective("scl", dim, normalize="full", distributed=False)
    x = big[0].detach()
    return {
        "dim": dim,
        "local_batch": local,
        "global_batch": WORLD * local,
        "stat_numel": numel,
        "bytes_moments": 2 * (WORLD - 1) / WORLD * numel * 4,
        "bytes_gather": (WORLD - 1) * local * 2 * dim * 4,
        "step_s": step,
        "all_reduce_s": _timed(lambda: dist.all_reduce(flat), repeats),
        "all_gather_s": _timed(lambda: dist.all_gather(parts, rows), repeats),
        "compute_local_s": _timed(lambda: _fwd_bwd(alone, f, g), repeats),
        "compute_global_s": _timed(lambda: _fwd_bwd(alone, *big), repeats),
        "matmul_flops_per_s": 2.0 * len(x) * dim * dim / _timed(lambda: x.T @ x, repeats),
    }


def _worker(rank: int, port: int, points: list, repeats: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # two processes on a two-core machine
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    rows = [_measure_point(dim, local, repeats) for dim, local in points]
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def measure(points: list[tuple[int, int]], repeats: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.pt")
        mp.spawn(_worker, args=(port, points, repeats, out), nprocs=WORLD, join=True)
        rows = torch.load(out)
    # The rule's machine balance, one number for this machine: what one more row's Gram costs (a bare x^T x on
    # the global batch) over the bus bandwidth of the stats' all-reduce (medians over the points; all-reduces
    # under 1 MB are latency, not bandwidth). The objective's d x d elementwise work is the same on both routes.
    flops = statistics.median(r["matmul_flops_per_s"] for r in rows)
    bus = statistics.median(
        [r["bytes_moments"] / r["all_reduce_s"] for r in rows if r["bytes_moments"] >= 1e6]
        or [r["bytes_moments"] / r["all_reduce_s"] for r in rows]
    )
    for row in rows:
        row["flops_per_byte"] = flops / bus
        row["gather_over_moments"] = row["step_s"]["gather"] / row["step_s"]["moments"]
        row["faster"] = min(row["step_s"], key=row["step_s"].get)
        args = (row["stat_numel"], 2 * row["dim"], [row["local_batch"]] * WORLD, 4)
        row["auto_picks"] = choose_reduction(*args, row["flops_per_byte"])
        row["auto_picks_default"] = choose_reduction(*args, _default_flops_per_byte())
    return rows


def _default_flops_per_byte() -> float:
    from eigtrain.objectives import Objective

    return Objective.options["reduction_flops_per_byte"]


# ---------------------------------------------------------------------------------------------- modeled


def model_row(dim: int, batch: int, world: int, fabric: str, numel: int, element_size: int = 4) -> dict:
    """Per-step seconds of each route on `world` H100s: ring all-reduce 2(W-1)/W S/busbw + 2(W-1) alpha,
    ring all-gather (W-1)/W B 2d/busbw + (W-1) alpha (+ the size exchange), Gram flops at the sustained rate.
    Forward only: backward doubles both routes' bytes and flops alike."""
    bw, alpha, local = BUS_BW[fabric], LATENCY[fabric], batch // world
    flops_per_row = 2.0 * numel
    moments_comm = 2 * (world - 1) / world * numel * element_size / bw + 2 * (world - 1) * alpha
    gather_comm = (world - 1) * local * 2 * dim * element_size / bw + 2 * (world - 1) * alpha
    moments = {"comm_s": moments_comm, "compute_s": flops_per_row * local / H100_FP32_FLOPS}
    gather = {"comm_s": gather_comm, "compute_s": flops_per_row * batch / H100_FP32_FLOPS}
    for route in (moments, gather):
        route["total_s"] = route["comm_s"] + route["compute_s"]
    fpb = H100_FP32_FLOPS / bw
    costs = reduction_costs(numel, 2 * dim, [local] * world, element_size, fpb)
    return {
        "dim": dim,
        "global_batch": batch,
        "world": world,
        "fabric": fabric,
        "stat_numel": numel,
        "bytes_moments": 2 * (world - 1) / world * numel * element_size,
        "bytes_gather": (world - 1) * local * 2 * dim * element_size,
        "moments": moments,
        "gather": gather,
        "gather_over_moments": gather["total_s"] / moments["total_s"],
        "auto_picks": "gather" if costs["gather"] < costs["moments"] else "moments",
        "flops_per_byte": fpb,
    }


def model(dims: list[int], batches: list[int], worlds: list[int]) -> list[dict]:
    rows = []
    for dim in dims:
        numel = stat_numel("scl", dim, normalize="full")
        for world in worlds:
            fabrics = ["nvswitch"] if world <= 8 else ["ndr_8nic", "ndr_1nic"]
            for batch in batches:
                if batch // world >= 2:
                    rows.extend(model_row(dim, batch, world, fabric, numel) for fabric in fabrics)
    return rows


# ---------------------------------------------------------------------------------------------- output


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _header(*names) -> list[str]:
    return [_row(*names), "|" + "---|" * len(names)]


def _split(route: dict) -> str:
    return f"{_ms(route['total_s'])} ({_ms(route['comm_s'])} + {_ms(route['compute_s'])})"


def markdown(measured: list[dict], modeled: list[dict]) -> str:
    balance = measured[0]["flops_per_byte"] if measured else 0.0
    lines = [f"Measured: auto picks with this machine's {balance:.3g} flop/byte", ""]
    lines += _header(
        "d",
        "global batch",
        "MB all-reduce",
        "MB gather",
        "step moments ms",
        "step gather ms",
        "gather/moments",
        "all-reduce ms",
        "all-gather ms",
        "compute B/W ms",
        "compute B ms",
        "Gram GFLOP/s",
        "faster",
        "auto picks",
    )
    for r in measured:
        megabytes = (f"{r['bytes_moments'] / 1e6:.3g}", f"{r['bytes_gather'] / 1e6:.3g}")
        lines.append(
            _row(
                r["dim"],
                r["global_batch"],
                *megabytes,
                _ms(r["step_s"]["moments"]),
                _ms(r["step_s"]["gather"]),
                f"{r['gather_over_moments']:.2f}",
                _ms(r["all_reduce_s"]),
                _ms(r["all_gather_s"]),
                _ms(r["compute_local_s"]),
                _ms(r["compute_global_s"]),
                f"{r['matmul_flops_per_s'] / 1e9:.3g}",
                r["faster"],
                r["auto_picks"],
            )
        )
    for fabric in BUS_BW:  # one matrix per fabric: gather/moments time ratio and the route auto picks
        rows = [r for r in modeled if r["fabric"] == fabric]
        columns = sorted({(r["world"], r["global_batch"]) for r in rows})
        lines += [
            "",
            f"**{fabric}** ({BUS_BW[fabric] / 1e9:.0f} GB/s bus bandwidth, "
            f"{H100_FP32_FLOPS / BUS_BW[fabric]:.0f} flop/byte): gather/moments time, route auto picks",
            "",
        ]
        lines += _header("d", *(f"W={w}, B={b}" for w, b in columns))
        for dim in sorted({r["dim"] for r in rows}):
            cell = {(r["world"], r["global_batch"]): r for r in rows if r["dim"] == dim}
            lines.append(_row(dim, *(f"{cell[c]['gather_over_moments']:.2f} {cell[c]['auto_picks']}" for c in columns)))
    lines += [""] + _header(
        "d",
        "global batch",
        "GPUs",
        "fabric",
        "MB all-reduce",
        "MB gather",
        "moments ms (comm + compute)",
        "gather ms (comm + compute)",
        "gather/moments",
        "auto picks",
    )
    for r in (r for r in modeled if r["dim"] == max(x["dim"] for x in modeled)):
        lines.append(
            _row(
                r["dim"],
                r["global_batch"],
                r["world"],
                r["fabric"],
                f"{r['bytes_moments'] / 1e6:.4g}",
                f"{r['bytes_gather'] / 1e6:.4g}",
                _split(r["moments"]),
                _split(r["gather"]),
                f"{r['gather_over_moments']:.2f}",
                r["auto_picks"],
            )
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=_ints, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--local-batches", type=_ints, default=[16, 128], help="per rank, measured")
    parser.add_argument("--max-measured-dim", type=int, default=4096, help="d = 8192: ~1 min a step here")
    parser.add_argument("--big-batch-max-dim", type=int, default=1024, help="the larger local batches up to this d")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--global-batches", type=_ints, default=[256, 1024, 4096, 16384], help="modeled")
    parser.add_argument("--worlds", type=_ints, default=[8, 64, 256, 1024], help="modeled")
    parser.add_argument("--model-only", action="store_true")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables of benchmarks/scaling.md here")
    args = parser.parse_args(argv)
    smallest = min(args.local_batches)
    points = [
        (d, b)
        for d in args.dims
        if d <= args.max_measured_dim
        for b in args.local_batches
        if b == smallest or d <= args.big_batch_max_dim
    ]
    measured = [] if args.model_only else measure(points, args.repeats)
    modeled = model(args.dims, args.global_batches, args.worlds)
    json.dump({"world": WORLD, "measured": measured, "modeled": modeled}, sys.stdout, indent=1)
    print()
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(markdown(measured, modeled) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
