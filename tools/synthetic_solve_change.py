"""How much a change of the Rayleigh-Ritz solve moves the synthetic table, apart from training.

  git show fd36b15:eigtrain/rayleigh_ritz.py > /tmp/previous_rayleigh_ritz.py   # the solve to compare with
  OMP_NUM_THREADS=1 python tools/synthetic_solve_change.py /tmp/previous_rayleigh_ritz.py \
      kernel=legendre rank=10 steps=4000 seeds=0,1

Trains one ensemble (LoRA-RR, RQ-RR, VICReg-RR x seeds, the `eigtrain` preset with the table's 10^6 fresh
pairs and 10^5 evaluation samples), then feeds the same encoded pairs of each network to the shipped
accumulator and solve and to the previous module's (a self-contained rayleigh_ritz.py with RRAccumulator and
solve(acc, mode, center)), and evaluates both with the same evaluate(). Prints JSON: per run, the largest
eigenvalue difference and both EF-MSE / EV-RAE. Retraining cannot tell a solve's change from a training
change (the training code's rounding moves a 4e3-step run); this can.
"""

import importlib.util
import json
import sys
import time

import torch

from eigtrain.export.moments import RRAccumulator
from eigtrain.synthetic.extract import (
    MEAN_INVARIANT,
    Extracted,
    accumulate_pairs,
    evaluate,
    rayleigh_ritz,
    target_first,
)
from eigtrain.synthetic.grid import cell_configs, parse_grid_args
from eigtrain.synthetic.kernels import build_kernel
from eigtrain.synthetic.train import STREAM_EVAL, STREAM_EXTRACT, generator, train


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("previous_rayleigh_ritz", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"synthetic_solve_change: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Both:
    """Hands each encoded batch to both accumulators, so the pairs are drawn and encoded once."""

    def __init__(self, *accs):
        self.accs = accs

    def update(self, f: torch.Tensor, g: torch.Tensor) -> None:
        for acc in self.accs:
            acc.update(f, g)


def main(argv: list[str]) -> dict:
    previous = load_module(argv[0])
    keys = dict(a.split("=", 1) for a in argv[1:])
    kernel_name, rank = keys.get("kernel", "legendre"), int(keys.get("rank", 10))
    steps, seeds = int(keys.get("steps", 4000)), keys.get("seeds", "0")
    grid = parse_grid_args(
        [
            f"kernels={kernel_name}",
            f"ranks={rank}",
            "methods=lora-rr,rq-rr,vicreg-rr",
            f"seeds={seeds}",
            f"steps={steps}",
            "rr_samples=1000000",
            "eval_samples=100000",
            "threads=1",
            "recipe=eigtrain",
        ]
    )
    cfgs = cell_configs(grid, kernel_name, rank)
    kernel = build_kernel(kernel_name, rank, None)
    torch.set_num_threads(1)
    start = time.perf_counter()
    ensemble, histories, _ = train(cfgs, kernel)
    ensemble.eval()
    rows = []
    for m, cfg in enumerate(cfgs):
        member = ensemble.member(m)
        shipped_acc, previous_acc = RRAccumulator(cfg.dim, pairs=False), previous.RRAccumulator(cfg.dim)
        both = Both(shipped_acc, previous_acc)  # the pairs the grid draws for this seed
        accumulate_pairs(member, kernel, cfg.rr_samples, generator(cfg.seed, STREAM_EXTRACT), both)  # type: ignore[arg-type]
        center = cfg.objective in MEAN_INVARIANT
        shipped = rayleigh_ritz(shipped_acc, "generalized", center)
        r = previous.solve(previous_acc, mode="generalized", center=center)
        before = Extracted(r.eigenvalues.double(), r.transform.double(), r.mean.double())
        metrics = evaluate(
            member,
            kernel,
            {"shipped": shipped, "previous": before},
            cfg.eval_samples,
            generator(cfg.seed, STREAM_EVAL),
            target_first(cfg.objective),
        )
        ef = [metrics[k]["ef_mse_per_function"] for k in ("shipped", "previous")]
        rows.append(
            {
                "objective": cfg.objective,
                "seed": cfg.seed,
                "final_loss": histories[m][-1]["loss"],
                "max_abs_eigenvalue_diff": (shipped.eigenvalues - before.eigenvalues).abs().max().item(),
                "max_abs_ef_mse_per_function_diff": max(abs(x - y) for x, y in zip(*ef)),
                "ef_mse_shipped_previous": [metrics[k]["ef_mse"] for k in ("shipped", "previous")],
                "ev_rae_shipped_previous": [metrics[k]["ev_rae"] for k in ("shipped", "previous")],
            }
        )
    return {
        "kernel": kernel_name,
        "rank": rank,
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "max_abs_eigenvalue_diff": max(r["max_abs_eigenvalue_diff"] for r in rows),
        "max_abs_ef_mse_per_function_diff": max(r["max_abs_ef_mse_per_function_diff"] for r in rows),
        "runs": rows,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1))
