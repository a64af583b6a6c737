"""Issue 53 item 3: how long each console script takes to refuse a bad key (and to print -h), in a fresh process,
against `python -c "import torch"` measured beside it (what every refusal cost before the commands checked their
configuration first). The bar: under 1.5 s on 2 cores.

    python tools/bench_command_start.py [--repeats 5] [--out benchmarks/command_start.json]

Prints JSON: per command the best and median seconds of `repeats` runs (the installed console script, as a user
runs it), and the ratio of the best to torch's import.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "eigtrain-train": ["stepz=3"],
    "eigtrain-rr": ["run_dir=r", "bogus=1"],
    "eigtrain-eval": ["run_dir=r", "bogus=1"],
    "eigtrain-embed": ["run_dir=r", "out=o", "bogus=1"],
    "eigtrain-export": ["run_dir=r", "out=o", "bogus=1"],
    "eigtrain-shards": ["source=nope", "out=o"],
    "eigtrain-synthetic": ["bogus=1"],
}


def timed(argv: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bin_dir = Path(sys.executable).parent
    torch_s = timed([sys.executable, "-c", "import torch"], args.repeats)
    rows = {"import torch": {"best_s": round(min(torch_s), 3), "median_s": round(statistics.median(torch_s), 3)}}
    for name, bad in CASES.items():
        script = shutil.which(name, path=str(bin_dir)) or name
        for label, argv in ((name, bad), (f"{name} -h", ["-h"])):
            seconds = timed([script, *argv], args.repeats)
            rows[label] = {
                "best_s": round(min(seconds), 3),
                "median_s": round(statistics.median(seconds), 3),
                "over_import_torch": round(min(seconds) / min(torch_s), 3),
            }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"commit": commit, "command": "python " + " ".join(sys.argv), "loadavg": os.getloadavg()[0], "rows": rows}
    print(json.dumps(record, indent=1))
    if args.out:
        records = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*records, record], indent=1) + "\n")


if __name__ == "__main__":
    main()
