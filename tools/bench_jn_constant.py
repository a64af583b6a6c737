"""Issue 22 item 2: do the first joint-nesting prefixes learn the constant eigenfunction?

Trains the quickstart recipe (tiny CNN, digits, joint nesting over every prefix) with each objective /
normalization for STEPS steps and prints, per variant, the constant share E[f_i]^2 / E[f_i^2] of the first 8
coordinates on the validation split (1 = a constant coordinate). Results: benchmarks/jn_constant.md.

    python tools/bench_jn_constant.py [STEPS=100] [DIGITS=data/digits]
"""

import json
import sys
import tempfile
from pathlib import Path

from eigtrain.embed import embed_split, open_run
from eigtrain.probes import constant_share
from eigtrain.train import compose_config, run

VARIANTS = {
    "scl normalize=full (quickstart)": ["objective=scl"],
    "scl normalize=none": ["objective=scl", "objective.normalize=none"],
    "scl normalize=prefix": ["objective=scl", "objective.normalize=prefix"],
    "vicreg_paper": ["objective=vicreg_paper"],
}


def main(steps: int = 100, digits: str = "data/digits") -> None:
    for name, extra in VARIANTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run(compose_config(["experiment=quickstart", f"run_dir={Path(tmp) / 'run'}", f"data.root={digits}",
                                f"steps={steps}", f"checkpoint_every={steps}", "cpu_threads=1", "logging.progress=false",
                                "logging.wandb.mode=disabled", *extra]))
            z, _ = embed_split(open_run(str(Path(tmp) / "run")), "val")
            shares = [round(v, 3) for v in constant_share(z[:, :8])]
            print(json.dumps({"variant": name, "steps": steps, "constant_share_first8": shares}), flush=True)


if __name__ == "__main__":
    main(*(int(a) if i == 0 else a for i, a in enumerate(sys.argv[1:])))
