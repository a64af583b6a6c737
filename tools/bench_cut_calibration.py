"""Issue 54: the per-cut statistic against ground truth. For each cell (width d, pairs n, cut k, gap g) many
independent samples are drawn from two-view Gaussians with known eigenpairs (tests/support/known_pairs.py: the
latent Gram is I, the cross moment diag(lambda)); each is reduced and solved as eigtrain-rr does (RRAccumulator
with 8 folds in contiguous blocks of rows, the generalized solve, prefixes.cut_errors), and the reported error at
cut k is set beside the measured one, ||sin Theta||_F^2 between the exported top-k span and the true one.

    python tools/bench_cut_calibration.py [--quick] [--out benchmarks/cut_calibration]

The spectrum: k eigenvalues from 0.95 down to 0.5 + g/2, then d - k from 0.5 - g/2 down to 0.05 (the gap at the cut
is g; every pair the cut separates adds its own share of the error, which grows with k (d - k) / n). Correlated
rows: `group` consecutive rows share their latent signal (several augmentations of one image written next to each
other); their folds are contiguous blocks (what reduce_embeddings does) or, as before, the row mod 8. Writes
OUT.json and OUT.md (the table; the criterion: reported within a factor of 1.5 of measured wherever measured >
1e-3). Choose nothing on it: it is a check of first-order theory, not a fit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from eigtrain.export.moments import RRAccumulator  # noqa: E402
from eigtrain.export.prefixes import UNDETERMINED_AT, cut_errors  # noqa: E402
from eigtrain.export.rayleigh_ritz import solve  # noqa: E402

FOLDS = 8
# (d, n, k, samples); gaps below. Widths up to 2,048 with n >> d (the eigenvalues, not only the order, need it).
CELLS = [(16, 2000, 4, 40), (64, 2000, 8, 40), (256, 8000, 16, 24), (1024, 20000, 32, 10), (2048, 40000, 32, 6)]
GAPS = [0.02, 0.1, 0.67]
CORRELATED = [(16, 2000, 4, 40, 8), (64, 4000, 8, 24, 16)]  # (d, images, k, samples, rows per image)


def spectrum(d: int, k: int, gap: float) -> np.ndarray:
    return np.concatenate([np.linspace(0.95, 0.5 + gap / 2, k), np.linspace(0.5 - gap / 2, 0.05, d - k)])


def views(lam: np.ndarray, images: int, group: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(u1, u2), images * group rows: the rows of one image share its signal s (correlated rows when group > 1)."""
    shared = np.repeat(rng.standard_normal((images, len(lam))), group, axis=0)
    noise = lambda: np.sqrt(1 - lam) * rng.standard_normal(shared.shape)  # noqa: E731
    return np.sqrt(lam) * shared + noise(), np.sqrt(lam) * shared + noise()


def one_sample(lam: np.ndarray, images: int, k: int, seed: int, group: int = 1, contiguous: bool = True) -> tuple:
    """(reported error at cut k, measured ||sin Theta||^2) for one independent sample."""
    rng = np.random.default_rng(seed)
    u1, u2 = views(lam, images, group, rng)
    n = len(u1)
    rows = torch.arange(n)
    fold = rows * FOLDS // n if contiguous else rows % FOLDS
    acc = RRAccumulator(len(lam), folds=FOLDS)
    acc.update(torch.from_numpy(u1), torch.from_numpy(u2), fold=fold)
    result = solve(acc)
    reported = float(cut_errors(result, acc)[k - 1])
    q, _ = np.linalg.qr(result.transform[:, :k].numpy())  # the latent basis is the truth's: top k = e_1 .. e_k
    measured = float(k - np.square(q[:k]).sum())
    return reported, measured


def cell(d: int, images: int, k: int, gap: float, samples: int, group: int = 1, contiguous: bool = True) -> dict:
    lam = spectrum(d, k, gap)
    start = time.perf_counter()
    pairs = [one_sample(lam, images, k, 1000 * s + d, group, contiguous) for s in range(samples)]
    reported, measured = (np.array(x) for x in zip(*pairs))
    mean_r, mean_m = reported.mean(), measured.mean()
    return {
        "d": d,
        "n": images * group,
        "k": k,
        "gap": gap,
        "rows_per_image": group,
        "folds": "contiguous" if contiguous else "row mod 8",
        "samples": samples,
        "measured": float(mean_m),
        "measured_se": float(measured.std(ddof=1) / np.sqrt(samples)),
        "reported": float(mean_r),
        "ratio": float(mean_r / mean_m) if mean_m > 0 else None,
        "within_1.5": bool(mean_m <= 1e-3 or 1 / 1.5 <= mean_r / mean_m <= 1.5),
        "flagged": float((reported >= UNDETERMINED_AT).mean()),
        "truly_above": float((measured >= UNDETERMINED_AT).mean()),
        "seconds": round(time.perf_counter() - start, 1),
    }


def table(rows: list[dict]) -> str:
    head = (
        "| d | n | k | gap | rows per image | folds | samples | measured E‖sin Θ‖² | reported | ratio | within 1.5× | "
        "flagged ≥ 0.05 | truly ≥ 0.05 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    line = (
        "| {d} | {n:,} | {k} | {gap} | {rows_per_image} | {folds} | {samples} | {measured:.2e} ± {measured_se:.1e} | "
        "{reported:.2e} | {ratio_text} | {ok} | {flagged:.0%} | {truly_above:.0%} |"
    )
    body = [
        line.format(
            **r,
            ratio_text=f"{r['ratio']:.2f}" if r["ratio"] else "–",
            ok=("yes" if r["within_1.5"] else "**no**") if r["measured"] > 1e-3 else "(≤ 1e-3)",
        )
        for r in rows
    ]
    return head + "\n".join(body) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the widths up to 256 only")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/cut_calibration"))
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rows = []
    for d, n, k, samples in CELLS[:3] if args.quick else CELLS:
        for gap in GAPS:
            rows.append(cell(d, n, k, gap, samples))
            print(json.dumps(rows[-1]), flush=True)
    for d, images, k, samples, group in CORRELATED:
        for contiguous in (True, False):
            rows.append(cell(d, images, k, 0.1, samples, group, contiguous))
            print(json.dumps(rows[-1]), flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"commit": commit, "command": "python tools/bench_cut_calibration.py" + " --quick" * args.quick}
    args.out.with_suffix(".json").write_text(json.dumps({**record, "rows": rows}, indent=1) + "\n")
    md = (
        "# The per-cut statistic against ground truth\n\n[← benchmarks](../docs/benchmarks.md) · made by `"
        f"{record['command']}` at {commit}; what it measures: the tool's docstring and docs/export.md.\n\n"
    )
    args.out.with_suffix(".md").write_text(md + table(rows))


if __name__ == "__main__":
    main()
