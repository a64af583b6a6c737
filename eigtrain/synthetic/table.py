"""The table mode: a grid of runs over kernels, ranks, methods and seeds, one JSON per run, then a
markdown table laid out like the paper's Table 1 (mean ± standard error, ours beside the paper's) and a
PNG of estimated against true eigenfunctions.
"""

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from eigtrain.synthetic.config import SyntheticConfig, apply_overrides
from eigtrain.synthetic.paper import METHODS, PAPER_STEPS, PAPER_TABLE
from eigtrain.synthetic.run import run

METHOD_LABELS = {"lora-rr": "LoRA-RR", "lora-jn": "LoRA-JN", "rq-rr": "RQ-RR", "rq-jn": "RQ-JN", "vicreg-rr": "VICReg-RR", "vicreg-jn": "VICReg-JN"}
# eigtrain objective per method family: in the views case LoRA with one encoder is SCL (unnormalized).
FAMILY_OBJECTIVE = {"lora": "scl", "rq": "rq", "vicreg": "vicreg"}
EXTRACTION = {"jn": "joint", "rr": "rr"}
# Run keys that do not change a result: a stored run with other values of these is reused.
NON_RESULT_KEYS = ("out", "log_every", "threads")


@dataclass
class TableConfig:
    kernels: str = "legendre,fourier"
    ranks: str = "8"
    methods: str = "lora-jn,lora-rr,rq-jn,rq-rr,vicreg-rr"
    seeds: str = "0,1,2"
    dir: str = "benchmarks/synthetic"  # one JSON per run, and the PNG
    out: str = "benchmarks/synthetic/table.md"
    run: bool = True  # false: only render what is stored
    run_overrides: list = field(default_factory=list)

    def grid(self):
        kernels, ranks = self.kernels.split(","), [int(r) for r in self.ranks.split(",")]
        methods, seeds = self.methods.split(","), [int(s) for s in self.seeds.split(",")]
        for method in methods:
            if method not in METHODS:
                raise ValueError(f"methods: {method!r} is unknown; allowed: {', '.join(METHODS)}")
        return kernels, ranks, methods, seeds


def parse_table_args(args: list[str]) -> TableConfig:
    table_keys = {f.name for f in dataclasses.fields(TableConfig)} - {"run_overrides"}
    own = [a for a in args if a.partition("=")[0] in table_keys]
    cfg = apply_overrides(TableConfig(), own)
    cfg.run_overrides = [a for a in args if a.partition("=")[0] not in table_keys]
    return cfg


def run_config(table: TableConfig, kernel: str, rank: int, method: str, seed: int) -> SyntheticConfig:
    """The run of one cell: run keys, then KERNEL.key=value keys for this kernel only."""
    family, how = method.split("-")
    shared = [a for a in table.run_overrides if "." not in a.partition("=")[0]]
    own = [a.partition(".")[2] for a in table.run_overrides if a.startswith(f"{kernel}.")]
    base = apply_overrides(SyntheticConfig(), shared + own)
    path = Path(table.dir) / f"{kernel}_r{rank}_{method}_s{seed}.json"
    cfg = dataclasses.replace(base, kernel=kernel, rank=rank, objective=FAMILY_OBJECTIVE[family], extraction=EXTRACTION[how], seed=seed, out=str(path))
    return cfg.validate()


def same_result(stored: dict, cfg: SyntheticConfig) -> bool:
    """Whether a stored run's config gives cfg's result; keys added since it ran take their defaults."""
    stored = {**dataclasses.asdict(SyntheticConfig()), **stored}
    wanted = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NON_RESULT_KEYS}
    return {k: stored[k] for k in wanted} == wanted


def load_or_run(cfg: SyntheticConfig, allow_run: bool) -> dict | None:
    path = Path(cfg.out)
    if path.exists():
        result = json.loads(path.read_text())
        if same_result(result["config"], cfg):
            return result
        if not allow_run:
            print(f"table: {path} was made with another config; skipped (run=true re-runs it)", file=sys.stderr)
            return None
    if not allow_run:
        return None
    print(f"table: running {path.name}", file=sys.stderr, flush=True)
    result = run(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def cell(values: list[float]) -> str:
    if not values:
        return "—"
    mean, se = mean_se(values)
    return f"{mean:.3f} ± {se:.3f}" if not math.isnan(se) else f"{mean:.3f}"


def markdown(table: TableConfig, results: dict) -> str:
    """results: (kernel, rank, method) -> list of run dicts."""
    kernels, ranks, methods, _ = table.grid()
    ordered = [m for m in METHODS if m in methods]
    header = "| Kernel | Metric | " + " | ".join(METHOD_LABELS[m] for m in ordered) + " |"
    lines = [header, "|" + "---|" * (2 + len(ordered))]
    for kernel in kernels:
        for rank in ranks:
            paper = PAPER_TABLE.get((kernel, rank))
            label = f"{kernel.capitalize()} r={rank}, d={rank // 2}"
            for metric, name in (("ef_mse", "EF-MSE"), ("ev_rae", "EV-RAE")):
                ours = [cell([r[metric] for r in results.get((kernel, rank, m), [])]) for m in ordered]
                lines.append(f"| {label} | {name} ours | " + " | ".join(ours) + " |")
                if paper:
                    theirs = [f"{paper[metric][m][0]:.3f} ± {paper[metric][m][1]:.3f}" for m in ordered]
                    lines.append(f"| {label} | {name} paper | " + " | ".join(theirs) + " |")
    return "\n".join(lines) + "\n"


def extractions_markdown(table: TableConfig, results: dict) -> str:
    names = ("ordered", "ordered_gs", "rr_generalized", "rr_paper")
    lines = ["| Kernel | Method | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for kernel, rank, m, runs in _cells_with_runs(table, results):
        cells = []
        for name in names:
            ef = sum(r["extractions"][name]["ef_mse"] for r in runs) / len(runs)
            ev = sum(r["extractions"][name]["ev_rae"] for r in runs) / len(runs)
            cells.append(f"{ef:.3f} / {ev:.3f}")
        lines.append(f"| {kernel} r={rank} | {METHOD_LABELS[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cells_with_runs(table: TableConfig, results: dict):
    """(kernel, rank, method, runs) for every grid cell that has runs, in table order."""
    kernels, ranks, methods, _ = table.grid()
    for kernel in kernels:
        for rank in ranks:
            for m in [m for m in METHODS if m in methods]:
                if runs := results.get((kernel, rank, m), []):
                    yield kernel, rank, m, runs


def per_function_markdown(table: TableConfig, results: dict) -> str:
    lines = ["| Kernel | Method | EF-MSE per function (mean over seeds) | EV-RAE per function | eigenvalues true / estimated (seed 0) |", "|---|---|---|---|---|"]
    for kernel, rank, m, runs in _cells_with_runs(table, results):
        d = len(runs[0]["ef_mse_per_function"])
        ef = [sum(r["ef_mse_per_function"][i] for r in runs) / len(runs) for i in range(d)]
        ev = [sum(r["ev_rae_per_function"][i] for r in runs) / len(runs) for i in range(d)]
        eig = " ".join(f"{t:.4f}/{e:.4f}" for t, e in zip(runs[0]["eigenvalues_true"], runs[0]["eigenvalues_estimated"]))
        lines.append(
            f"| {kernel} r={rank} | {METHOD_LABELS[m]} | {' '.join(f'{x:.4f}' for x in ef)} | {' '.join(f'{x:.3f}' for x in ev)} | {eig} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: TableConfig, results: dict, path: Path) -> None:
    """One row per (kernel, rank), one panel per eigenfunction: true (gray) and each method (seed 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernels, ranks, methods, _ = table.grid()
    rows = [(k, r) for k in kernels for r in ranks if any(results.get((k, r, m)) for m in methods)]
    if not rows:
        return
    d = max(r // 2 for _, r in rows)
    fig, axes = plt.subplots(len(rows), d, figsize=(3.2 * d, 2.6 * len(rows)), squeeze=False)
    for row, (kernel, rank) in enumerate(rows):
        for m in [m for m in METHODS if m in methods]:
            runs = results.get((kernel, rank, m))
            if not runs:
                continue
            run0 = runs[0]
            for i, curve in enumerate(run0["curve"]):
                axes[row, i].plot(run0["curve_grid"], curve, lw=1, label=METHOD_LABELS[m])
        for i in range(rank // 2):
            ax = axes[row, i]
            any_run = next(rr[0] for m in methods if (rr := results.get((kernel, rank, m))))
            true = any_run["curve_true"][i]
            ax.plot(any_run["curve_grid"], true, color="gray", lw=3, alpha=0.5, label="true")
            pad = 0.5 + 0.2 * (max(true) - min(true))  # also keeps the constant mode's axis readable
            ax.set_ylim(min(true) - pad, max(true) + pad)
            ax.set_title(f"{kernel} r={rank}: ψ{i + 1}" + (" (a, a)" if kernel == "fourier" else ""), fontsize=9)
        axes[row, 0].legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_table(table: TableConfig) -> str:
    kernels, ranks, methods, seeds = table.grid()
    results = {}
    for seed in seeds:  # seed-major: a partial grid still covers every cell
        for kernel in kernels:
            for rank in ranks:
                for method in methods:
                    cfg = run_config(table, kernel, rank, method, seed)
                    result = load_or_run(cfg, table.run)
                    if result is not None:
                        results.setdefault((kernel, rank, method), []).append(result)
    png = Path(table.dir) / "eigenfunctions.png"
    plot(table, results, png)
    counts = sorted({len(v) for v in results.values()}) or [0]
    settings = []
    for kernel in kernels:
        cfg = dataclasses.asdict(run_config(table, kernel, ranks[0], methods[0], seeds[0]))
        changed = {k: v for k, v in cfg.items() if k not in ("kernel", "rank", "objective", "extraction", "seed", "out") and v != getattr(SyntheticConfig(), k)}
        settings.append(f"{kernel}: steps {cfg['steps']} ({cfg['steps'] / PAPER_STEPS:.3g} of the paper's {PAPER_STEPS}); non-default keys {changed or 'none'}")
    text = (
        f"Runs per cell: {', '.join(map(str, counts))} (seeds {table.seeds}).\n"
        + "".join(f"- {line}\n" for line in settings)
        + "\n"
        + markdown(table, results)
        + "\nEvery extraction of the same runs (EF-MSE / EV-RAE, mean over seeds); the table above uses "
        "`ordered_gs` for JN and `rr_generalized` for RR:\n\n"
        + extractions_markdown(table, results)
        + "\nPer-function errors:\n\n"
        + per_function_markdown(table, results)
        + f"\n![estimated vs true eigenfunctions]({png.name if Path(table.out).parent == png.parent else png})\n"
    )
    if table.out:
        Path(table.out).parent.mkdir(parents=True, exist_ok=True)
        Path(table.out).write_text(text)
    return text
