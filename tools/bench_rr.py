"""Benchmark the Rayleigh-Ritz reduction against plain encoder inference over the same data.

    python tools/bench_rr.py [--run-dir DIR] [--repeats 3]

Without --run-dir it first trains the cpu_debug experiment (digits, tiny CNN) into a temporary directory.
Both passes stream the whole train split once (one_pass, same workers, same augmentation, same encoder);
the reduction adds the float64 moment updates. Passes are interleaved and the medians compared; the steadier figure is the
time inside the accumulator updates over the rest of the same pass. Prints JSON; goal: overhead <= 5%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from eigtrain.data import build_augment
from eigtrain.export.embed import normalization, open_run, split_stream
from eigtrain.export.moments import RRAccumulator


@torch.no_grad()
def one_pass(run, reduce: bool, batch_size: int, workers: int) -> tuple[float, int, float]:
    """(seconds for the pass, samples, seconds inside the accumulator updates)."""
    data = run.cfg.data
    augment = build_augment(data.augment, image_size=data.view_size, **normalization(data))
    generator = torch.Generator().manual_seed(0)
    acc = RRAccumulator(run.cfg.dim) if reduce else None
    seen, in_update, start = 0, 0.0, time.perf_counter()
    for batch in split_stream(run, "train", batch_size, workers, 0, 1):
        v1, v2 = augment(batch["image"], generator=generator)
        z1, z2 = run.encoder(torch.cat([v1, v2])).chunk(2)
        if reduce:
            t = time.perf_counter()
            acc.update(z1, z2)
            in_update += time.perf_counter() - t
        seen += len(z1)
    return time.perf_counter() - start, seen, in_update


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    tmp = None
    if args.run_dir is None:
        from eigtrain.train.command import compose_config
        from eigtrain.train.command import run as train

        tmp = tempfile.TemporaryDirectory()
        args.run_dir = str(Path(tmp.name) / "run")
        train(
            compose_config(
                [
                    "experiment=cpu_debug",
                    f"run_dir={args.run_dir}",
                    f"data.root={Path(tmp.name) / 'digits'}",
                    "logging.progress=false",
                    "logging.wandb.mode=disabled",
                ]
            )
        )
    run = open_run(args.run_dir)
    one_pass(run, True, args.batch_size, args.workers)  # warm-up (worker start, caches)
    plain, reduced = [], []
    for i in range(args.repeats):  # alternate the order: the second pass of a pair may run warmer or colder
        for reduce in (False, True) if i % 2 == 0 else (True, False):
            (reduced if reduce else plain).append(one_pass(run, reduce, args.batch_size, args.workers))
    t_plain, t_reduced = statistics.median(r[0] for r in plain), statistics.median(r[0] for r in reduced)
    # The steadier figure: the update's share measured inside the same pass.
    inside = statistics.median(u / (t - u) for t, _, u in reduced)
    n = plain[0][1]
    print(
        json.dumps(
            {
                "run_dir": args.run_dir,
                "samples": n,
                "dim": run.cfg.dim,
                "threads": torch.get_num_threads(),
                "inference_samples_per_s": n / t_plain,
                "reduction_samples_per_s": n / t_reduced,
                "overhead_interleaved_passes": t_reduced / t_plain - 1.0,
                "overhead_update_share": inside,
                "goal": "overhead <= 0.05",
            },
            indent=2,
        )
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
