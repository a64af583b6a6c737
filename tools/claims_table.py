"""Table and eigenvalue-decay plot from tools/bench_claims.py's reports: benchmarks/claims.md, claims_eigenvalues.png.

    python tools/claims_table.py
"""

import json
import statistics
from pathlib import Path

ROOT = Path("benchmarks/claims")
METHODS = ("RR", "RR (paper)", "JN", "FF", "PCA", "RS")
DIMS = ("4", "8", "16")
NAMES = {"scl": "SCL", "vicreg_paper": "VICReg (paper form)"}


def load() -> dict:
    cells = {}
    for path in sorted(ROOT.glob("*-seed*/report.json")):
        objective, seed = path.parent.name.rsplit("-seed", 1)
        cells.setdefault(objective, {})[int(seed)] = (json.loads(path.read_text()),
                                                      json.loads((path.parent / "eigenvalues.json").read_text()))
    return cells


def fmt(values: list[float]) -> str:
    if not values:
        return "–"
    mean = 100 * statistics.mean(values)
    return f"{mean:.1f} ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else f"{mean:.1f}"


def table(cells: dict) -> list[str]:
    lines = []
    for objective, seeds in cells.items():
        steps = {e["steps"] for _, e in seeds.values()}
        lines += ["", f"### {NAMES.get(objective, objective)} — {len(seeds)} seed(s) {sorted(seeds)}, {steps.pop()} steps, "
                      "closed-form probe, digits validation (359 images); accuracy %, mean ± sd over seeds", "",
                  "| Method \\ k | " + " | ".join(DIMS) + " |", "|---|" + "---|" * len(DIMS)]
        for method in METHODS:
            row = [fmt([r["accuracy"][method][k] for r, _ in seeds.values() if k in r["accuracy"].get(method, {})]) for k in DIMS]
            lines.append(f"| {method} | " + " | ".join(row) + " |")
    return lines


def spectrum_lines(cells: dict) -> list[str]:
    """Item 4 across the runs: the spectrum's k (90 % of sum lambda, on the evaluated sizes) vs the probe's smallest
    k within 1 / 5 points of RR at k = 32; and how flat each spectrum is (lambda_16 / lambda_1, beyond the trivial
    mode)."""
    lines = ["", "### Spectrum's k vs measured k (RR), and spectrum flatness", "",
             "| objective | seed | k: 50 % Σλ | k: 90 % Σλ | measured, 1 pt | measured, 5 pt | λ₁ | λ₁₆ / λ₁ |",
             "|---|---|---|---|---|---|---|---|"]
    for objective, seeds in cells.items():
        for seed, (r, e) in sorted(seeds.items()):
            sug, meas, lam = r["spectrum"]["suggested"], r["spectrum"]["measured"], e["eigenvalues"]
            lines.append(f"| {NAMES.get(objective, objective)} | {seed} | {sug['sum_0.5']['k_on_grid']} | "
                         f"{sug['sum_0.9']['k_on_grid']} | {meas['1pt']} | {meas['5pt']} | {lam[0]:.3f} | {lam[15] / lam[0]:.3f} |")
    return lines


def plot(cells: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    for i, (objective, seeds) in enumerate(cells.items()):
        for j, (_, e) in enumerate(seeds.values()):
            values = e["eigenvalues"]
            ax.plot(range(1, len(values) + 1), values, color=f"C{i}", alpha=0.8,
                    label=NAMES.get(objective, objective) if j == 0 else None)
    ax.set_xlabel("index i (beyond the trivial mode)")
    ax.set_ylabel("Rayleigh–Ritz eigenvalue")
    ax.set_title("eigenvalue decay on digits, SCL vs VICReg", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    cells = load()
    Path("benchmarks/claims_table.md").write_text("\n".join(table(cells) + spectrum_lines(cells)).lstrip() + "\n")
    plot(cells, Path("benchmarks/claims_eigenvalues.png"))
    print(Path("benchmarks/claims_table.md").read_text())
