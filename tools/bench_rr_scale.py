"""The Rayleigh-Ritz pass at scale: `eigtrain-rr embeddings=FILE` with its defaults against the same moments and
generalized eigendecomposition computed in memory with numpy/scipy, side by side on the same files.

    python tools/bench_rr_scale.py [--n 40000] [--dims 512 2048 8192] [--repeats 1] [--out FILE.json]

For each d: writes n pairs (z1, z2 float32, a known two-view model) to a temporary .npy pair, then times (in
alternation, `--repeats` times) the command in a fresh process (its peak resident memory from the kernel) and the
tight reference (`reference`, issue 54), also in a fresh process (records before 2c070ad ran it in this one):
float64 blocks of rows, a = z1 + z2 and b = z1 - z2, two rank-k updates, one scipy.linalg.eigh (the looser reference before it formed z1'z1, z2'z2 and z1'z2 after full float64 copies).
Prints JSON: seconds (the best of the repeats, and each), the ratio of the bests command / reference (the issue's
bar: <= 1.3 at d = 2048), the command's peak resident memory in GiB. --out appends one record (the commit, the
command line, the load average before and after, the rows) to the JSON list in FILE.
--parts adds, per d, what the command does that the reference does not, each in a fresh process timed the same way:
`import torch` alone, the files' sha256 (the manifest's provenance), and the command with folds=0 (no per-cut test):
where the gap to the reference goes (the `parts` of a row, best of the repeats).
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


def write_pairs(directory: Path, n: int, d: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lam = np.linspace(0.95, 0.05, d)
    mix = rng.standard_normal((d, d)).astype(np.float32) / np.sqrt(d) + np.eye(d, dtype=np.float32)
    z1 = np.lib.format.open_memmap(directory / "z1.npy", "w+", np.float32, (n, d))
    z2 = np.lib.format.open_memmap(directory / "z2.npy", "w+", np.float32, (n, d))
    for start in range(0, n, 8192):
        rows = min(8192, n - start)
        shared = rng.standard_normal((rows, d))
        for z in (z1, z2):
            view = np.sqrt(lam) * shared + np.sqrt(1 - lam) * rng.standard_normal((rows, d))
            z[start : start + rows] = view.astype(np.float32) @ mix.T
    z1.flush()
    z2.flush()
    return directory


def reference(directory: Path, block: int = 8192, check: bool = False):
    """The tight in-memory reference (issue 54): the same identity eigtrain-rr uses -- with a = z1 + z2 and
    b = z1 - z2, both views' Gram is (a'a + b'b) / 4n and the symmetrized cross moment (a'a - b'b) / 4n -- so two
    rank-k updates (numpy's a.T @ a is BLAS syrk) on float64 blocks of rows, the pooled mean's rank-one correction,
    and one generalized eigh. No full-size float64 copy, no third product."""
    import scipy.linalg

    start = time.perf_counter()
    z1, z2 = (np.load(directory / f"z{i}.npy", mmap_mode="r") for i in (1, 2))
    n, d = z1.shape
    plus, minus, total = np.zeros((d, d)), np.zeros((d, d)), np.zeros(d)
    for s in range(0, n, block):
        f, g = (np.asarray(z[s : s + block], dtype=np.float64) for z in (z1, z2))
        a, b = f + g, f - g
        plus += a.T @ a
        minus += b.T @ b
        total += a.sum(0)
    mean_a = total / n  # a - 2m with m the pooled mean; b needs no centring (m cancels)
    plus -= n * np.outer(mean_a, mean_a)
    gram, cross = (plus + minus) / (4 * n), (plus - minus) / (4 * n)
    values = scipy.linalg.eigh(cross, gram, eigvals_only=check)
    seconds = time.perf_counter() - start
    return (seconds, values) if check else seconds


def child(args: list[str]) -> tuple[float, float]:
    """(seconds, peak resident GiB) of one fresh process, timed from outside; its own peak (wait4's rusage)."""
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(err[-2000:])
    return seconds, usage.ru_maxrss / 2**20


def fresh_reference(directory: Path) -> float:
    """Seconds of `reference` in a fresh process, timed from outside as the command is (its interpreter, numpy and
    scipy imports included: like for like)."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_rr_scale as b; "
    code += f"from pathlib import Path; b.reference(Path({str(directory)!r}))"
    return child([sys.executable, "-c", code])[0]


def command(directory: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak GiB of the child) of eigtrain-rr with its defaults, through its console script's entry point
    (eigtrain.commands.rr: what users run; records before it ran `python -m eigtrain.export.command`)."""
    entry = "import sys; from eigtrain.commands import rr; sys.exit(rr())"
    return child([sys.executable, "-c", entry, f"embeddings={directory}", f"out={out}"])


def parts(directory: Path, out: Path) -> dict[str, float]:
    """Seconds of the command's fixed costs the reference has not, each in a fresh process (see --parts)."""
    digest = "from eigtrain.runs.checksums import path_sha256; path_sha256(" + repr(str(directory)) + ")"
    entry = "import sys; from eigtrain.commands import rr; sys.exit(rr())"
    no_cuts = [sys.executable, "-c", entry, f"embeddings={directory}", f"out={out}", "folds=0"]
    return {
        "python_import_torch_s": child([sys.executable, "-c", "import torch"])[0],
        "python_sha256_of_files_s": child([sys.executable, "-c", digest])[0],
        "eigtrain_rr_folds0_s": child(no_cuts)[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40000)
    parser.add_argument("--dims", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--parts", action="store_true", help="also time the command's fixed costs apart")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for d in args.dims:
        with tempfile.TemporaryDirectory() as tmp:
            data = write_pairs(Path(tmp), args.n, d)
            ours, theirs, peaks, pieces = [], [], [], []
            for r in range(args.repeats):
                seconds, peak = command(data, Path(tmp) / f"rr{r}")
                ours.append(seconds)
                peaks.append(peak)
                # the command's figures at once (at d = 8,192 the reference takes as long again)
                print(
                    json.dumps(
                        {
                            "d": d,
                            "n": args.n,
                            "repeat": r,
                            "eigtrain_rr_s": round(seconds, 2),
                            "eigtrain_rr_peak_gib": round(peak, 2),
                        }
                    ),
                    flush=True,
                )
                theirs.append(fresh_reference(data))
                if args.parts:
                    pieces.append(parts(data, Path(tmp) / f"parts{r}"))
            row = {
                "d": d,
                "n": args.n,
                "eigtrain_rr_s": round(min(ours), 2),
                "numpy_scipy_s": round(min(theirs), 2),
                "ratio": round(min(ours) / min(theirs), 3),
                "eigtrain_rr_peak_gib": round(max(peaks), 2),
                "eigtrain_rr_s_each": [round(x, 2) for x in ours],  # every repeat, in the order run
                "numpy_scipy_s_each": [round(x, 2) for x in theirs],
            }
            if pieces:  # the best of the repeats, each part apart
                row["parts"] = {k: round(min(p[k] for p in pieces), 2) for k in pieces[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "eigtrain"], capture_output=True, text=True).stdout
        record = {
            "commit": commit + ("+uncommitted" if dirty.strip() else ""),
            "command": "python " + " ".join(sys.argv),
            "loadavg_1_5_15": {
                "before": [round(x, 2) for x in load_before],
                "after": [round(x, 2) for x in os.getloadavg()],
            },
            "rows": rows,
        }
        records = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*records, record], indent=1) + "\n")


if __name__ == "__main__":
    main()
