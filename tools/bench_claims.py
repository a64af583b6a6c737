"""Issue 22 item 5 (partial): the paper's image-level claims on digits — RR (both conventions), JN, PCA, FF at
k in {4, 8, 16}, RS — for SCL, VICReg (paper form) and RQ, and the eigenvalue decay of each export.

    python tools/bench_claims.py STEPS SEED [SEED ...] [VARIANT ...]  # -> benchmarks/claims/<variant>-seed<S>/
                                            # VARIANT: scl (default), scl_constant_none, vicreg_paper (default), rq

Each cell trains the quickstart recipe (tiny CNN, digits, dim 32, joint nesting) for STEPS steps, fixed-size
encoders (nesting=none) at 4, 8, 16, runs eigtrain-rr with its defaults (the exact solve, trivial mode excluded;
the constant-kept convention rides along) and again with the paper's own algorithm for the objective as written
(appendix F: F.3 `mode=paper-lora` for SCL, F.2 `mode=paper-vicreg` for VICReg, F.1 `mode=paper-rq` for RQ;
`trivial=keep`; rows "RR F.3" / "RR F.2" / "RR F.1"), and eigtrain-eval with the paper's SGD probe (softmax
regression, 50 epochs, cosine schedule).
Training and eigtrain-rr keep the quickstart's own defaults (its 2 CPU threads, eigtrain-rr's data workers), so
the `scl` cell at 300 steps is `bash tools/quickstart.sh` at that seed (the seed-0 model is bit-identical).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from eigtrain.evaluate.command import EvalConfig, evaluate
from eigtrain.export.command import main as rr_main
from eigtrain.train.command import compose_config, run

# each row of the table: its training overrides (scl_constant_none: SCL before the constant was held outside)
VARIANTS = {
    "scl": ("objective=scl",),
    "scl_constant_none": ("objective=scl", "objective.constant_mode=none"),
    "vicreg_paper": ("objective=vicreg_paper",),
    "rq": ("objective=rq",),
}
OBJECTIVES = ("scl", "vicreg_paper")
PAPER_ALGORITHM = {"scl": ("RR F.3", "paper-lora"), "scl_constant_none": ("RR F.3", "paper-lora")}
PAPER_ALGORITHM["vicreg_paper"] = ("RR F.2", "paper-vicreg")
PAPER_ALGORITHM["rq"] = ("RR F.1", "paper-rq")
FF_DIMS = (4, 8, 16)
OUT = Path("benchmarks/claims")


def train(run_dir: Path, steps: int, seed: int, objective: str, *extra: str) -> None:
    run(
        compose_config(
            [
                "experiment=quickstart",
                f"run_dir={run_dir}",
                "data.root=data/digits",
                f"steps={steps}",
                f"checkpoint_every={steps}",
                f"seed={seed}",
                *VARIANTS[objective],
                "logging.progress=false",
                "logging.wandb.mode=disabled",
                *extra,
            ]
        )
    )


def cell(steps: int, seed: int, objective: str) -> None:
    out = OUT / f"{objective}-seed{seed}"
    with tempfile.TemporaryDirectory() as tmp:
        main = Path(tmp) / "main"
        train(main, steps, seed, objective)
        ffs = []
        for k in FF_DIMS:
            train(Path(tmp) / f"ff{k}", steps, seed, objective, "nesting=none", f"dim={k}")
            ffs.append(str(Path(tmp) / f"ff{k}"))
        assert rr_main([f"run_dir={main}"]) == 0
        row, mode = PAPER_ALGORITHM[objective]
        assert rr_main([f"run_dir={main}", f"mode={mode}", "trivial=keep", f"out={main / 'rr-paper'}"]) == 0
        report, _ = evaluate(
            EvalConfig(
                run_dir=str(main),
                ff_run_dirs=ffs,
                probe="sgd",
                retrieval="none",
                dims=[4, 8, 16, 32],
                out=str(Path(tmp) / "eval"),
            )
        )
        paper, _ = evaluate(  # the same model's export by the paper's algorithm as written, beside the default
            EvalConfig(
                run_dir=str(main),
                rr=str(main / "rr-paper"),
                probe="sgd",
                retrieval="none",
                pca=False,
                random_draws=0,
                dims=[4, 8, 16, 32],
                out=str(Path(tmp) / "eval-paper"),
            )
        )
        report["accuracy"][row] = paper["accuracy"]["RR"]
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        report["commit"] = head or "unknown"
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        spectra = {
            name: json.loads((main / d / "manifest.json").read_text())["spectrum"]
            for name, d in (("eigenvalues", "rr"), (f"eigenvalues, {row}", "rr-paper"))
        }
        (out / "eigenvalues.json").write_text(json.dumps({**spectra, "steps": steps}) + "\n")


if __name__ == "__main__":
    steps, *seeds = (int(a) for a in sys.argv[1:] if a.isdigit())
    chosen = [a for a in sys.argv[2:] if not a.isdigit()] or OBJECTIVES
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        sys.exit(f"bench_claims: unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    for seed in seeds:
        for objective in chosen:
            cell(steps, seed, objective)
            print(f"done {objective} seed {seed}", flush=True)
