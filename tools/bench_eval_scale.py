"""eigtrain-eval at scale: peak memory and wall time of `eigtrain-eval features=FILE` with its defaults on 60,000
training and 10,000 test vectors of width 784 and 2,048.

    python tools/bench_eval_scale.py [--dims 784 2048] [--n-train 60000] [--n-test 10000] [--out FILE.json]

Width 784 is Fashion-MNIST's raw pixels (scaled to 0..1) when Debian's dataset-fashion-mnist is installed (the
floor a learned embedding must beat), else class-structured Gaussian vectors; other widths are those Gaussian
vectors (10 classes). Each evaluation runs in a fresh process; its peak resident memory is the kernel's
(wait4's ru_maxrss), its time the wall clock, with the load average before and after (the machine may be shared:
the time is indicative, the memory is not load-dependent). Prints JSON; --out appends one record (commit, command
line, rows) to the JSON list in FILE. The issue's bar: within 8 GiB, in minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FASHION = Path("/usr/share/datasets/fashion-mnist")


def fashion_pixels(n_train: int, n_test: int) -> dict[str, np.ndarray] | None:
    from eigtrain.data.idx_files import read_split

    if not FASHION.is_dir():
        return None
    (train_x, train_y), (test_x, test_y) = read_split(FASHION, "train"), read_split(FASHION, "t10k")
    flat = lambda x: x.reshape(len(x), -1).astype(np.float32) / 255  # noqa: E731
    return {
        "train_z": flat(train_x[:n_train]),
        "train_y": train_y[:n_train],
        "test_z": flat(test_x[:n_test]),
        "test_y": test_y[:n_test],
    }


def gaussian_classes(n_train: int, n_test: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, d)).astype(np.float32) / np.sqrt(d) * 3
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = rng.integers(0, 10, n)
        arrays[f"{split}_z"] = centers[y] + rng.standard_normal((n, d), dtype=np.float32) / np.sqrt(d)
        arrays[f"{split}_y"] = y
    return arrays


def run_eval(features: Path, out: Path) -> dict:
    argv = [sys.executable, "-c", "import sys; from eigtrain.evaluate.command import main; sys.exit(main())"]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    child = subprocess.Popen([*argv, f"features={features}", f"out={out}"], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    return {
        "exit_status": os.waitstatus_to_exitcode(status),
        "seconds": round(seconds, 1),
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),  # kilobytes on Linux
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "eigtrain"], capture_output=True, text=True, check=False)
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[784, 2048])
    parser.add_argument("--n-train", type=int, default=60000)
    parser.add_argument("--n-test", type=int, default=10000)
    parser.add_argument("--out", type=Path, default=None, help="append the record to this JSON list")
    args = parser.parse_args()
    rows, made_at = [], commit()  # the code that runs (the tree may change while a long run goes on)
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.dims:
            arrays = fashion_pixels(args.n_train, args.n_test) if d == 784 else None
            source = "Fashion-MNIST raw pixels" if arrays is not None else "Gaussian classes"
            arrays = arrays if arrays is not None else gaussian_classes(args.n_train, args.n_test, d)
            features = Path(tmp) / f"features_{d}.npz"
            np.savez(features, **arrays)
            row = {"d": d, "n_train": args.n_train, "n_test": args.n_test, "features": source}
            row.update(run_eval(features, Path(tmp) / f"eval_{d}"))
            print(json.dumps(row), flush=True)
            rows.append(row)
    record = {
        "commit": made_at,
        "command": " ".join(sys.argv),
        "defaults": "eigtrain-eval features=FILE",
        "rows": rows,
    }
    print(json.dumps(record, indent=1))
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*old, record], indent=1) + "\n")


if __name__ == "__main__":
    main()
