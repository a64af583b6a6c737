"""eigtrain-synthetic: one run, or a table over a grid of runs.

  eigtrain-synthetic kernel=KERNEL rank=8 objective=OBJECTIVE extraction=joint|rr steps=N seed=S out=FILE.json \\
      [any SyntheticConfig key=value]
  eigtrain-synthetic preset=paper|eigtrain ...   the paper's recipe (appendix G) or eigtrain's
  eigtrain-synthetic grid recipe=paper|eigtrain kernels=legendre,fourier ranks=8,6,10 seeds=0,1,2,3,4 \\
      dir=DIR steps=N    one batched ensemble (6 methods x seeds) per (kernel, rank), one compact JSON each
  eigtrain-synthetic table recipes=paper,eigtrain dir=benchmarks/synthetic out=benchmarks/synthetic/table.md
      renders the grid's cell files as the paper's Table 1 (runs nothing)
"""

import json
import sys
from pathlib import Path

from eigtrain import safe_files
from eigtrain.synthetic.config import OBJECTIVES, parse_run_args
from eigtrain.synthetic.grid import parse_grid_args, run_grid
from eigtrain.synthetic.kernels import KERNELS
from eigtrain.synthetic.run import run
from eigtrain.synthetic.table import make_table, parse_table_args


def summary(result: dict) -> dict:
    keys = (
        "kernel",
        "rank",
        "objective",
        "extraction",
        "ef_mse",
        "ev_rae",
        "ef_mse_per_function",
        "ev_rae_per_function",
    )
    out = {k: result[k] for k in keys}
    out["alternatives"] = {k: {m: v[m] for m in ("ef_mse", "ev_rae")} for k, v in result["extractions"].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(f"{__doc__}\nKERNEL: {', '.join(KERNELS)}\nOBJECTIVE: {', '.join(OBJECTIVES)}")
        return 0
    try:
        if args and args[0] == "table":
            print(make_table(parse_table_args(args[1:])))
            return 0
        if args and args[0] == "grid":
            print("\n".join(str(p) for p in run_grid(parse_grid_args(args[1:]))))
            return 0
        cfg = parse_run_args(args).validate()
        result = run(cfg)
    except (ValueError, FileNotFoundError) as error:
        print(f"eigtrain-synthetic: {error}", file=sys.stderr)
        return 2
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        safe_files.write_text(cfg.out, json.dumps(result, indent=1))
    print(json.dumps(summary(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
