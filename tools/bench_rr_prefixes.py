"""Issue 22: which prefixes of the quickstart's Rayleigh-Ritz export the data determines.

Trains the quickstart recipe (SCL, l2-normalized, joint nesting, tiny CNN, digits, dim 32) for STEPS steps per
seed with its own defaults (2 CPU threads; eigtrain-rr's data workers), runs eigtrain-rr (its split-half agreement,
eigtrain.rr_prefixes) and writes the first eigenvalues (the manifest's spectrum, before tie ordering) and the
agreement of each prefix to benchmarks/rr_prefixes.json; README's sentence on it is checked against that file
(tests/system/test_readme_headline.py).

    python tools/bench_rr_prefixes.py [STEPS=300] [SEEDS=3]
"""

import json
import sys
import tempfile
from pathlib import Path

from eigtrain.rr_job import main as rr_main
from eigtrain.train import compose_config, run

OUT = Path("benchmarks/rr_prefixes.json")


def seed_row(tmp: Path, steps: int, seed: int) -> dict:
    run_dir = tmp / f"seed{seed}"
    overrides = ["experiment=quickstart", f"run_dir={run_dir}", "data.root=data/digits", f"steps={steps}"]
    overrides += [f"checkpoint_every={steps}", f"seed={seed}", "logging.progress=false"]
    run(compose_config([*overrides, "logging.wandb.mode=disabled"]))
    assert rr_main([f"run_dir={run_dir}"]) == 0
    manifest = json.loads((run_dir / "rr" / "manifest.json").read_text())
    return {
        "seed": seed,
        "eigenvalues_first8": [round(v, 4) for v in manifest["spectrum"][:8]],
        "agreement": manifest["reproducibility"],
        "halves_n": manifest["halves_n"],
    }


if __name__ == "__main__":
    steps, seeds = (int(a) for a in (sys.argv[1:] + ["300", "3"][len(sys.argv[1:]) :])[:2])
    with tempfile.TemporaryDirectory() as tmp:
        rows = [seed_row(Path(tmp), steps, seed) for seed in range(seeds)]
    OUT.write_text(json.dumps({"steps": steps, "runs": rows}, indent=1) + "\n")
    print(json.dumps({"steps": steps, "runs": rows}))
