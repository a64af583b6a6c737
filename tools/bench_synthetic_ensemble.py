"""Speed of the batched synthetic ensemble against one unbatched run per configuration (same work).

  OMP_NUM_THREADS=1 python tools/bench_synthetic_ensemble.py [kernel=legendre rank=10 steps=20 members=30]

Prints JSON: seconds per training step per run, unbatched (train_single, one run after another) and
batched (one ensemble of `members` runs: the six methods x seeds), measured side by side in one process.
"""

import dataclasses
import json
import sys
import time

import torch

from eigtrain.synthetic.config import parse_run_args
from eigtrain.synthetic.kernels import build_kernel
from eigtrain.synthetic.train import train, train_single

METHODS = [
    ("scl", "joint"),
    ("scl", "rr"),
    ("rq", "joint"),
    ("rq", "rr"),
    ("vicreg_paper", "joint"),
    ("vicreg_paper", "rr"),
]


def main(argv):
    opts = dict(a.split("=", 1) for a in argv)
    members, unbatched_runs = int(opts.pop("members", 30)), int(opts.pop("unbatched_runs", 6))
    keys = {"rank": 10, "steps": 20, "constant_mode": "learned", "log_every": 1000000, **opts}  # given keys win
    base = parse_run_args([f"{k}={v}" for k, v in keys.items()])
    torch.set_num_threads(base.threads)
    cfgs = [
        dataclasses.replace(base, objective=o, extraction=e, seed=i // len(METHODS))
        for i, (o, e) in zip(range(members), METHODS * members)
    ]
    kernel = build_kernel(base.kernel, base.rank)
    start = time.perf_counter()
    for cfg in cfgs[:unbatched_runs]:  # the six methods, one run after another
        train_single(cfg, kernel)
    unbatched = (time.perf_counter() - start) / (unbatched_runs * base.steps)
    start = time.perf_counter()
    train(cfgs, kernel)
    batched = (time.perf_counter() - start) / (members * base.steps)
    print(
        json.dumps(
            {
                "kernel": base.kernel,
                "rank": base.rank,
                "batch_size": base.batch_size,
                "width": base.width,
                "depth": base.depth,
                "threads": base.threads,
                "steps": base.steps,
                "members": members,
                "unbatched_seconds_per_run_step": round(unbatched, 5),
                "batched_seconds_per_run_step": round(batched, 5),
                "speedup": round(unbatched / batched, 2),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
