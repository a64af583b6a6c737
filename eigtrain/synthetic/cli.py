"""eigtrain-synthetic's command (usage and configuration: eigtrain.synthetic.config, checked before torch)."""

import json
import sys
from pathlib import Path

from eigtrain import safe_files
from eigtrain.synthetic.config import USAGE, parse_run_args
from eigtrain.synthetic.grid import parse_grid_args, run_grid
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
        print(USAGE)
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
