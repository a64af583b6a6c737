"""The table mode: render the grid's cell files (eigtrain.synthetic.grid) as the paper's Table 1, each
recipe's row beside the paper's numbers (mean ± standard error over seeds), the goal check for the
eigtrain recipe, every extraction of the same runs, per-function errors, and a PNG of the functions.

  eigtrain-synthetic table recipes=paper,eigtrain dir=benchmarks/synthetic out=benchmarks/synthetic/table.md
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from eigtrain import safe_files
from eigtrain.cli import compose_dataclass
from eigtrain.synthetic.config import stored_with_defaults
from eigtrain.synthetic.paper import METHODS, PAPER_STEPS, PAPER_TABLE, superseded

METHOD_LABELS = {
    "lora-rr": "LoRA-RR",
    "lora-jn": "LoRA-JN",
    "rq-rr": "RQ-RR",
    "rq-jn": "RQ-JN",
    "vicreg-rr": "VICReg-RR",
    "vicreg-jn": "VICReg-JN",
}
METRICS = (("ef_mse", "EF-MSE"), ("ev_rae", "EV-RAE"))
EXTRACTIONS = ("ordered_paper", "ordered", "ordered_gs", "rr_generalized", "rr_paper")


@dataclass
class TableConfig:
    recipes: list[str] = field(default_factory=lambda: ["paper", "eigtrain"])  # sub-directories of dir, by `grid`
    goal: list[str] = field(default_factory=lambda: ["eigtrain"])  # the recipes whose cells get the goal check
    union: list[str] = field(default_factory=list)  # budgets of one recipe: a cell is met if any of them meets it
    kernels: list[str] = field(default_factory=lambda: ["legendre", "fourier"])  # the table's kernels, in order
    ranks: list[int] = field(default_factory=lambda: [6, 8, 10])  # the table's ranks, in order
    dir: str = "benchmarks/synthetic"  # holds one sub-directory per recipe; eigenfunctions.png is written here
    out: str = "benchmarks/synthetic/table.md"  # the markdown written (empty: print only)


def parse_table_args(args: list[str]) -> TableConfig:
    return compose_dataclass(TableConfig, args)


def load_cells(table: TableConfig) -> dict:
    """(recipe, kernel, rank) -> cell dict, for the cells present; superseded VICReg results (compared with
    psi_1..psi_d, which a centered objective cannot represent) are left out."""
    cells = {}
    for recipe in dict.fromkeys(table.recipes + table.union):
        for kernel in table.kernels:
            for rank in table.ranks:
                path = Path(table.dir) / recipe / f"{kernel}_r{rank}.json"
                if path.exists():
                    cell = json.loads(path.read_text())
                    cell["methods"] = {m: r for m, r in cell["methods"].items() if not superseded(r)}
                    cells[(recipe, kernel, rank)] = cell
    return cells


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def fmt(values: list[float]) -> str:
    if not values:
        return "—"
    mean, se = mean_se(values)
    return f"{mean:.3f} ± {se:.3f}" if not math.isnan(se) else f"{mean:.3f}"


def meets_goal(cell: dict, kernel: str, rank: int, method: str) -> bool:
    """eigtrain's goal: EF-MSE <= 1/3 of the paper's and EV-RAE <= the paper's (means)."""
    paper = PAPER_TABLE[(kernel, rank)]
    ours = cell["methods"][method]
    return (
        mean_se(ours["ef_mse"])[0] <= paper["ef_mse"][method][0] / 3
        and mean_se(ours["ev_rae"])[0] <= paper["ev_rae"][method][0]
    )


def main_table(table: TableConfig, cells: dict) -> str:
    recipes = table.recipes
    header = "| Kernel | Metric | Rows | " + " | ".join(METHOD_LABELS[m] for m in METHODS) + " |"
    lines = [header, "|" + "---|" * (3 + len(METHODS))]
    for kernel in table.kernels:
        for rank in table.ranks:
            label = f"{kernel.capitalize()} r={rank}, d={rank // 2}"
            for metric, name in METRICS:
                for recipe in recipes:
                    cell = cells.get((recipe, kernel, rank))
                    if not cell:  # a budget run only in some cells gets no row of dashes in the others
                        continue
                    values = [fmt(cell["methods"][m][metric]) if m in cell["methods"] else "—" for m in METHODS]
                    lines.append(f"| {label} | {name} | {recipe} recipe | " + " | ".join(values) + " |")
                paper = PAPER_TABLE.get((kernel, rank))
                if paper:
                    lines.append(
                        f"| {label} | {name} | the paper | "
                        + " | ".join(f"{paper[metric][m][0]:.3f} ± {paper[metric][m][1]:.3f}" for m in METHODS)
                        + " |"
                    )
    return "\n".join(lines) + "\n"


def method_header(first: str) -> list[str]:
    return [f"| {first} | " + " | ".join(METHOD_LABELS[m] for m in METHODS) + " |", "|---|" + "---|" * len(METHODS)]


def kernel_ranks(table: TableConfig):
    """The (kernel, rank) cells a table covers, in the paper's order."""
    return ((kernel, rank) for kernel in table.kernels for rank in table.ranks)


def goal_table(table: TableConfig, cells: dict, recipe: str = "eigtrain") -> str:
    """The goal check of one recipe's cells; methods a cell file does not hold are left out."""
    lines = method_header("Kernel")
    met = total = 0
    for kernel, rank in kernel_ranks(table):
        if cell := cells.get((recipe, kernel, rank)):
            ok = [meets_goal(cell, kernel, rank, m) for m in METHODS if m in cell["methods"]]
            met, total = met + sum(ok), total + len(ok)
            marks = (
                ("yes" if meets_goal(cell, kernel, rank, m) else "no") if m in cell["methods"] else "—" for m in METHODS
            )
            lines.append(f"| {kernel} r={rank} | " + " | ".join(marks) + " |")
    return f"Cells meeting the goal ({recipe} recipe): **{met} of {total}**.\n\n" + "\n".join(lines) + "\n"


def union_table(table: TableConfig, cells: dict) -> str:
    """The goal check over several budgets of one recipe: each cell names the budget(s) that meet it."""
    recipes = table.union
    lines = method_header("Kernel")
    met = 0
    for kernel, rank in kernel_ranks(table):
        marks = []
        for m in METHODS:
            runs = [
                (r, cells[(r, kernel, rank)])
                for r in recipes
                if m in cells.get((r, kernel, rank), {"methods": {}})["methods"]
            ]
            meeting = [r for r, cell in runs if meets_goal(cell, kernel, rank, m)]
            met += bool(meeting)
            marks.append(f"yes ({', '.join(meeting)})" if meeting else ("no" if runs else "not run"))
        lines.append(f"| {kernel} r={rank} | " + " | ".join(marks) + " |")
    total = len(table.kernels) * len(table.ranks) * len(METHODS)
    return (
        f"Cells meeting the goal with any of {', '.join(recipes)}: **{met} of {total}**.\n\n"
        + "\n".join(lines)
        + "\n"
        + "\nThe same budgets' values (EF-MSE / EV-RAE, mean ± s.e. over seeds; **bold: goal met**):\n\n"
        + union_values_table(table, cells)
    )


def union_values_table(table: TableConfig, cells: dict) -> str:
    """One row per budget that ran a cell, then the paper's row: the numbers behind union_table."""

    def value(cell: dict, kernel: str, rank: int, m: str) -> str:
        if m not in cell["methods"]:
            return "not run"
        text = f"{fmt(cell['methods'][m]['ef_mse'])} / {fmt(cell['methods'][m]['ev_rae'])}"
        return f"**{text}**" if meets_goal(cell, kernel, rank, m) else text

    lines = method_header("Cell")
    for kernel, rank in kernel_ranks(table):
        for recipe in table.union:
            if cell := cells.get((recipe, kernel, rank)):
                lines.append(
                    f"| {kernel.capitalize()} r={rank} `{recipe}` | "
                    + " | ".join(value(cell, kernel, rank, m) for m in METHODS)
                    + " |"
                )
        paper = PAPER_TABLE[(kernel, rank)]
        lines.append(
            "| the paper | "
            + " | ".join(f"{paper['ef_mse'][m][0]:.3f} / {paper['ev_rae'][m][0]:.3f}" for m in METHODS)
            + " |"
        )
    return "\n".join(lines) + "\n"


def extractions_table(table: TableConfig, cells: dict) -> str:
    lines = [
        "| Recipe | Kernel | Method | reported | " + " | ".join(EXTRACTIONS) + " |",
        "|---|---|---|---|" + "---|" * len(EXTRACTIONS),
    ]
    for (recipe, kernel, rank), cell in sorted(cells.items()):
        for m in METHODS:
            ours = cell["methods"].get(m)
            if not ours:
                continue
            alts = [
                f"{mean_se(ours['extractions'][e]['ef_mse'])[0]:.3f} / {mean_se(ours['extractions'][e]['ev_rae'])[0]:.3f}"
                for e in EXTRACTIONS
                if e in ours["extractions"]
            ]
            lines.append(
                f"| {recipe} | {kernel} r={rank} | {METHOD_LABELS[m]} | {ours['extraction']} | "
                + " | ".join(alts)
                + " |"
            )
    return "\n".join(lines) + "\n"


def per_function_table(table: TableConfig, cells: dict) -> str:
    lines = [
        "| Recipe | Kernel | Method | EF-MSE per function (mean over seeds) | EV-RAE per function | eigenvalues true / estimated (seed 0) |",
        "|---|---|---|---|---|---|",
    ]
    for (recipe, kernel, rank), cell in sorted(cells.items()):
        for m in METHODS:
            ours = cell["methods"].get(m)
            if not ours:
                continue
            per_ef, per_ev = ours["ef_mse_per_function"], ours["ev_rae_per_function"]
            d = len(per_ef[0])
            ef = " ".join(f"{sum(r[i] for r in per_ef) / len(per_ef):.3f}" for i in range(d))
            ev = " ".join(f"{sum(r[i] for r in per_ev) / len(per_ev):.3f}" for i in range(d))
            true = ours.get("eigenvalues_true", cell["eigenvalues_true"])  # VICReg's: lambda_2..lambda_(d+1)
            eig = " ".join(f"{t:.4f}/{e:.4f}" for t, e in zip(true, ours["eigenvalues_estimated"][0]))
            lines.append(f"| {recipe} | {kernel} r={rank} | {METHOD_LABELS[m]} | {ef} | {ev} | {eig} |")
    return "\n".join(lines) + "\n"


def plot(cells: dict, path: Path, rank: int = 8) -> bool:
    """One row per (recipe, kernel) at `rank`, one panel per eigenfunction: true (gray) and each method (seed 0)."""
    rows = [(key, cell) for key, cell in sorted(cells.items()) if key[2] == rank]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = rank // 2
    fig, axes = plt.subplots(len(rows), d, figsize=(3.2 * d, 2.6 * len(rows)), squeeze=False)
    for row, ((recipe, kernel, _), cell) in enumerate(rows):
        for m, ours in cell["methods"].items():
            first = ours.get("target_first", 0)  # VICReg's curve i estimates psi_(i+2): drawn in that panel
            for i, curve in enumerate(ours["curve_seed0"][: d - first]):
                axes[row, i + first].plot(cell["curve_grid"], curve, lw=1, label=METHOD_LABELS[m])
        for i in range(d):
            true = cell["curve_true"][i]
            ax = axes[row, i]
            ax.plot(cell["curve_grid"], true, color="gray", lw=3, alpha=0.5, label="true")
            pad = 0.5 + 0.2 * (max(true) - min(true))
            ax.set_ylim(min(true) - pad, max(true) + pad)
            ax.set_title(
                f"{recipe}: {kernel} r={rank} ψ{i + 1}" + (" (a, a)" if kernel == "fourier" else ""), fontsize=8
            )
        axes[row, 0].legend(fontsize=5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_files.write_with(path, lambda tmp: fig.savefig(tmp, dpi=60, format="png"))
    plt.close(fig)
    return True


def budgets(cells: dict) -> str:
    lines = []
    for (recipe, kernel, rank), cell in sorted(cells.items()):
        c = stored_with_defaults(cell["config"])
        keys = {
            k: c[k]
            for k in (
                "steps",
                "batch_size",
                "lr",
                "adam_beta2",
                "schedule",
                "constant_mode",
                "fourier_features",
                "train_samples",
                "extraction_pairs",
                "rr_samples",
                "rr_tail",
                "rr_mode",
                "jn_readoff",
                "eval_samples",
            )
        }
        lines.append(
            f"- {recipe} / {kernel} r={rank}: seeds {cell['seeds']}, steps {c['steps']} ({c['steps'] / PAPER_STEPS:.3g} of the "
            f"paper's {PAPER_STEPS}), {len(cell['methods']) * len(cell['seeds'])} runs in {cell['wall_seconds']:.0f} s; {keys}"
        )
    return "\n".join(lines) + "\n"


def make_table(table: TableConfig) -> str:
    cells = load_cells(table)
    png = Path(table.dir) / "eigenfunctions.png"
    has_png = plot(cells, png)
    text = (
        "Budgets and settings per cell file:\n\n"
        + budgets(cells)
        + "\n"
        + main_table(table, cells)
        + "".join("\n" + goal_table(table, cells, recipe) for recipe in table.goal)
        + ("\n" + union_table(table, cells) if table.union else "")
        + "\nEvery extraction of the same runs (EF-MSE / EV-RAE, mean over seeds): `ordered_paper` is the paper's plain "
        "read-off, `ordered_gs` eigtrain's, `rr_paper` appendix F, `rr_generalized` eigtrain's Rayleigh-Ritz:\n\n"
        + extractions_table(table, cells)
        + "\nPer-function errors:\n\n"
        + per_function_table(table, cells)
        + (f"\n![estimated vs true eigenfunctions, r = 8, seed 0]({png.name})\n" if has_png else "")
    )
    if table.out:
        Path(table.out).parent.mkdir(parents=True, exist_ok=True)
        safe_files.write_text(table.out, text)
    return text
