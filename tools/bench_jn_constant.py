"""Issue 22 item 2: do the first joint-nesting prefixes learn the constant, and does holding it outside help?

Trains the quickstart recipe (tiny CNN, digits, joint nesting over every prefix, batch 256, dim 32) for STEPS
steps per variant and seed, and prints per variant: the constant share E[f_i]^2 / E[f_i^2] of the first 8
coordinates on the validation split (1 = a constant coordinate) and the JN probe accuracy at k = 4, 8, 16 (the
first k encoder coordinates; the closed-form ridge probe of eigtrain-eval's probe=closed_form, fitted on the
train split, scored on the validation split), with and without the constant held outside the nested prefixes
(objective.constant_mode, the default fixed since this measurement).
Results: benchmarks/jn_constant.md.

    python tools/bench_jn_constant.py [STEPS=300] [SEEDS=1] [DIGITS=data/digits] [VARIANT substring]
"""

import json
import statistics
import sys
import tempfile
from pathlib import Path

from eigtrain.evaluate.probes import constant_share, probe_accuracy
from eigtrain.export.embed import embed_split, open_run
from eigtrain.train.command import compose_config, run

NONE, FIXED = "objective.constant_mode=none", "objective.constant_mode=fixed"
VARIANTS = {
    "scl normalize=full, constant_mode=none": ["objective=scl", NONE],
    "scl normalize=full, constant_mode=fixed (the quickstart)": ["objective=scl", FIXED],
    "lora form (scl normalize=none), constant_mode=none": ["objective=scl", "objective.normalize=none", NONE],
    "lora form (scl normalize=none), constant_mode=fixed": ["objective=scl", "objective.normalize=none", FIXED],
    # RQ has no constant_mode: is its first mode the constant when it is not centered?
    "rq center=false": ["objective=rq"],
}
DIMS = (4, 8, 16)


def measure(run_dir: str) -> dict:
    trained = open_run(run_dir)
    (z_train, y_train), (z_val, y_val) = embed_split(trained, "train"), embed_split(trained, "val")
    acc = {
        k: round(100 * probe_accuracy(z_train[:, :k], y_train, z_val[:, :k], y_val, probe="closed_form").item(), 1)
        for k in DIMS
    }
    return {"constant_share_first8": [round(v, 3) for v in constant_share(z_val[:, :8])], "jn_acc": acc}


def train_and_measure(extra: list[str], steps: int, seed: int, digits: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run(
            compose_config(
                [
                    "experiment=quickstart",
                    f"run_dir={Path(tmp) / 'run'}",
                    f"data.root={digits}",
                    f"steps={steps}",
                    f"checkpoint_every={steps}",
                    f"seed={seed}",
                    "cpu_threads=1",
                    "logging.progress=false",
                    "logging.wandb.mode=disabled",
                    *extra,
                ]
            )
        )
        return measure(str(Path(tmp) / "run"))


def main(steps: int = 300, seeds: int = 1, digits: str = "data/digits", only: str = "") -> None:
    accs = {name: [] for name in VARIANTS if only in name}
    for seed in range(seeds):  # seed by seed, so that a partial run already compares every variant
        for name in accs:
            result = train_and_measure(VARIANTS[name], steps, seed, digits)
            accs[name].append(result["jn_acc"])
            print(json.dumps({"variant": name, "steps": steps, "seed": seed, **result}), flush=True)
    for name, rows in accs.items():
        mean = {k: round(statistics.mean(r[k] for r in rows), 1) for k in DIMS}
        sd = {k: round(statistics.stdev(r[k] for r in rows), 1) if len(rows) > 1 else None for k in DIMS}
        print(json.dumps({"variant": name, "steps": steps, "seeds": seeds, "mean_jn_acc": mean, "sd": sd}), flush=True)


if __name__ == "__main__":
    main(*(int(a) if i < 2 else a for i, a in enumerate(sys.argv[1:])))
