"""eigtrain-synthetic: one run, or a table over a grid of runs.

  eigtrain-synthetic kernel=legendre|fourier rank=8 objective=lora|scl|rq|rq_direct|vicreg \\
      extraction=joint|rr steps=N seed=S out=FILE.json [any SyntheticConfig key=value]
  eigtrain-synthetic preset=paper ...      the paper's setup and budget (3e5 steps on 1e7 pairs, constant lr)
  Fourier kernels at the default budget need fourier_features=products lr=3e-3 (see benchmarks/synthetic.md).
  eigtrain-synthetic table kernels=legendre,fourier ranks=8 methods=lora-jn,lora-rr,rq-jn,rq-rr,vicreg-rr \\
      seeds=0,1,2 dir=benchmarks/synthetic out=benchmarks/synthetic/table.md [run keys, e.g. steps=5000]
"""

import json
import sys
from pathlib import Path

from eigtrain.synthetic.config import SyntheticConfig, apply_overrides
from eigtrain.synthetic.run import run
from eigtrain.synthetic.table import make_table, parse_table_args


def summary(result: dict) -> dict:
    keys = ("kernel", "rank", "objective", "extraction", "ef_mse", "ev_rae", "ef_mse_per_function", "ev_rae_per_function")
    out = {k: result[k] for k in keys}
    out["alternatives"] = {k: {m: v[m] for m in ("ef_mse", "ev_rae")} for k, v in result["extractions"].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    try:
        if args and args[0] == "table":
            print(make_table(parse_table_args(args[1:])))
            return 0
        cfg = apply_overrides(SyntheticConfig(), args).validate()
        result = run(cfg)
    except (ValueError, FileNotFoundError) as error:
        print(f"eigtrain-synthetic: {error}", file=sys.stderr)
        return 2
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary(result), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
