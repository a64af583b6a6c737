"""Issue 22: which prefixes of the quickstart's Rayleigh-Ritz export the data determines.

Trains the quickstart recipe (SCL, l2-normalized, joint nesting, tiny CNN, digits, dim 32) for STEPS steps per
seed with its own defaults (2 CPU threads; eigtrain-rr's data workers), runs eigtrain-rr (its split-half agreement,
eigtrain.rr_prefixes) and writes the first eigenvalues (the manifest's spectrum, before tie ordering) and the
agreement of each prefix to benchmarks/rr_prefixes.json; README's sentence on it is checked against that file
(tests/system/test_readme_headline.py). Then, per run, how far RR's prefixes depend on the augmentation draws of
its one pass: eigtrain-rr again with `seed=0..DRAWS-1` (the views; the model is the same) with its defaults, without
the Gram's shrinkage (shrinkage=none: the sample moments as they are) and without the ordering of the groups the
halves do not order (tie_agreement=0), and eigtrain-eval's SGD probe at k = 4, 8, 16 for each export, PCA of the
same embedding beside it. The halves' agreement is recorded with and without the shrinkage.

    python tools/bench_rr_prefixes.py [STEPS=300] [SEEDS=3] [DRAWS=5]
"""

import json
import sys
import tempfile
from pathlib import Path

from eigtrain.evaluate import EvalConfig, evaluate
from eigtrain.rr_job import main as rr_main
from eigtrain.train import compose_config, run

OUT = Path("benchmarks/rr_prefixes.json")


def seed_row(tmp: Path, steps: int, seed: int, draws: int) -> dict:
    run_dir = tmp / f"seed{seed}"
    overrides = ["experiment=quickstart", f"run_dir={run_dir}", "data.root=data/digits", f"steps={steps}"]
    overrides += [f"checkpoint_every={steps}", f"seed={seed}", "logging.progress=false"]
    run(compose_config([*overrides, "logging.wandb.mode=disabled"]))
    assert rr_main([f"run_dir={run_dir}"]) == 0
    assert rr_main([f"run_dir={run_dir}", "shrinkage=none", f"out={run_dir / 'rr-none'}"]) == 0
    manifest = json.loads((run_dir / "rr" / "manifest.json").read_text())
    unshrunk = json.loads((run_dir / "rr-none" / "manifest.json").read_text())
    return {
        "seed": seed,
        "eigenvalues_first8": [round(v, 4) for v in manifest["spectrum"][:8]],
        "agreement": manifest["reproducibility"],
        "agreement, shrinkage=none": unshrunk["reproducibility"],
        "shrinkage": manifest["shrinkage"],
        "halves_n": manifest["halves_n"],
        "by_draw": by_draw(run_dir, draws),
    }


def by_draw(run_dir: Path, draws: int) -> dict:
    """Probe accuracy (%) at k = 4, 8, 16 of RR exported with each augmentation seed: with eigtrain-rr's defaults,
    without the Gram's shrinkage, and in eigenvalue order alone (tie_agreement=0); and of PCA."""
    variants = {"RR": [], "RR, shrinkage=none": ["shrinkage=none"], "RR, tie_agreement=0": ["tie_agreement=0"]}
    rows, pca = {name: [] for name in variants}, None
    for draw in range(draws):
        for index, (name, extra) in enumerate(variants.items()):
            export = run_dir / f"rr-draw{draw}-{index}"
            assert rr_main([f"run_dir={run_dir}", f"seed={draw}", f"out={export}", *extra]) == 0
            out = run_dir / f"eval-draw{draw}-{index}"
            evaluate(EvalConfig(run_dir=str(run_dir), rr=str(export), retrieval="none", dims=[4, 8, 16], out=str(out)))
            report = json.loads((out / "report.json").read_text())
            percent = lambda m: [round(100 * report["accuracy"][m][k], 2) for k in ("4", "8", "16")]  # noqa: E731
            rows[name].append(percent("RR"))
            pca = percent("PCA")
    return {"dims": [4, 8, 16], **rows, "PCA": pca}


if __name__ == "__main__":
    steps, seeds, draws = (int(a) for a in (sys.argv[1:] + ["300", "3", "5"][len(sys.argv[1:]) :])[:3])
    with tempfile.TemporaryDirectory() as tmp:
        rows = [seed_row(Path(tmp), steps, seed, draws) for seed in range(seeds)]
    OUT.write_text(json.dumps({"steps": steps, "draws": draws, "runs": rows}, indent=1) + "\n")
    print(json.dumps({"steps": steps, "draws": draws, "runs": rows}))
