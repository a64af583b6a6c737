"""eigtrain-eval's report: markdown table, CSV, JSON and the two PNG plots (accuracy and retrieval vs dimension)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from eigtrain import safe_files
from eigtrain.runs.output_dirs import EVAL_ENTRIES, check_output_dir
from eigtrain.runs.provenance import provenance_line
from eigtrain.runs.run_step import describe


def write_report(report: dict, out_dir: str | os.PathLike, title: str = "") -> dict[str, Path]:
    """Markdown + CSV table laid out like the paper's appendix tables, a JSON dump, and the PNG plot; `out_dir` must
    be new, empty or an earlier report's (its files are replaced; anything else there is refused)."""
    out = Path(out_dir)
    check_output_dir(out, EVAL_ENTRIES, "out")
    safe_files.make_dir(out)
    json_path = out / "report.json"  # the numbers first: a report that fails to render loses none of the work
    safe_files.write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    dims, acc = report["dims"], report["accuracy"]
    lines = _header_lines(report, title)
    lines.append("| Methods \\ Dims | " + " | ".join(str(k) for k in dims) + " |")
    lines.append("|---|" + "---|" * len(dims))
    for method, row in acc.items():
        cells = [f"{100 * row[k]:.2f}" if k in row else "–" for k in dims]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if report.get("random_subsets"):  # how many subsets RS averaged at each k (eigtrain.evaluate.table._draws_until)
        used = report["random_subsets"]
        lines += [
            "",
            "RS: the mean over random coordinate subsets; subsets (standard error of the mean, points): "
            + ", ".join(f"k={k}: {u['draws']} ({u['stderr']:.2f})" for k, u in used.items())
            + ".",
        ]
    lines += _paired_lines(report)
    if report["ordering"]:
        lines += ["", "Ordering check (RR, first k vs last k features):", ""]
        lines.append("| k | top-k | bottom-k |")
        lines.append("|---|---|---|")
        for k, row in report["ordering"].items():
            lines.append(f"| {k} | {100 * row['top']:.2f} | {100 * row['bottom']:.2f} |")
    if report["knn"]:
        lines += [
            "",
            "kNN accuracy (k=20, cosine in each method's own coordinates, not whitened, full dimension): "
            + ", ".join(f"{n}: {100 * v:.2f}" for n, v in report["knn"].items()),
        ]
    lines += _retrieval_lines(report)
    lines += _constant_and_spectrum_lines(report)
    paths = {
        "markdown": out / "table.md",
        "csv": out / "table.csv",
        "json": out / "report.json",
        "plot": out / "accuracy_vs_dim.png",
    }
    safe_files.write_text(paths["markdown"], "\n".join(lines) + "\n")
    with safe_files.atomic_open(paths["csv"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", *dims])
        for method, row in _extra_rows(report, acc):
            writer.writerow([method, *[row.get(k, "") for k in dims]])
    _plot(report, paths["plot"], title)
    if "retrieval" in report:
        paths["retrieval_plot"] = out / "retrieval_vs_dim.png"
        _plot_retrieval(report, paths["retrieval_plot"], title.replace("Accuracy (%)", "Accuracy and retrieval (%)"))
    return paths


def _header_lines(report: dict, title: str) -> list[str]:
    """The title, the probe, the data each split came from, the weights and the export's provenance (values read from
    someone's config or paths escaped to one line each)."""
    probe_note = (
        "linear probe, SGD 50 epochs"
        if report["probe"] == "sgd"
        else "closed-form ridge probe (faster, not the paper's SGD probe)"
    )
    if report.get("probe_features") == "whitened":
        probe_note += ", on each method's first k features whitened on the training split (it scores their span)"
    lines = [
        f"### {safe_files.one_line(title or 'Linear probe accuracy (%) by representation size')}",
        "",
        f"Probe: {probe_note}.",
        "",
    ]
    if report.get("data"):
        seen = " Embeddings l2-normalized, as the objective saw them." if report.get("input") == "l2_normalized" else ""
        data = {split: safe_files.one_line(report["data"][split]) for split in ("train", "test")}  # others' values
        lines += [f"Data: fitted on {data['train']}; scored on {data['test']}.{seen}", ""]
    if report.get("weights"):  # which step each run was scored at (an unfinished run's newest checkpoint)
        used = [
            safe_files.one_line(f"{w['run_dir']} at {describe(w['weights'], w['step'], w['steps'])}")
            for w in report["weights"]
        ]
        lines += [f"Weights: {'; '.join(used)}.", ""]
    if report.get("rr_export"):  # whose weights the export was solved on (eigtrain.runs.provenance)
        lines += [safe_files.one_line(provenance_line(report["rr_export"])), ""]
    return lines


RR_PAPER = "RR (paper)"  # Rayleigh-Ritz in the paper's convention: the constant mode kept as feature 1
PREFIX_METHODS = (("rr", "RR"), ("rr_paper", RR_PAPER), ("jn", "JN"), ("pca", "PCA"))

RETRIEVAL_METRICS = (("1nn", "1-NN"), ("recall@1", "R@1"), ("recall@10", "R@10"))
STORAGE_ROWS = (
    ("fp32", "bytes/vector fp32"),
    ("fp16", "bytes/vector fp16"),
    ("int8", "bytes/vector int8"),
    ("search_us_per_query", "search µs/query"),
)


def _extra_rows(report: dict, acc: dict):
    """(label, {k: cell}) rows of the CSV: accuracy, retrieval per method and metric, storage and time."""
    for method, row in acc.items():
        yield method, {k: f"{100 * v:.2f}" for k, v in row.items()}
    for method, row in report.get("retrieval", {}).items():
        for metric, label in RETRIEVAL_METRICS:
            yield f"{method} {label}", {k: f"{100 * v[metric]:.2f}" for k, v in row.items()}
    for key, label in STORAGE_ROWS:
        yield (
            label,
            {
                k: (f"{v[key]:.2f}" if isinstance(v[key], float) else v[key])
                for k, v in report.get("storage", {}).items()
            },
        )


def _paired_lines(report: dict) -> list[str]:
    """Differences between methods on the same test samples, each with its 95 % bootstrap interval."""
    paired = {name: row for name, row in report.get("paired", {}).items() if row}  # e.g. FF at none of the dims
    if not paired:
        return []
    dims = report["dims"]
    n = next(iter(next(iter(paired.values())).values()))["n"]
    lines = [
        "",
        f"Differences (points) on the same {n} test samples, 95 % bootstrap interval in brackets, then how many "
        "samples only the first / only the second gets right; an interval that holds 0 does not tell the two apart:",
        "",
        "| Comparison \\ Dims | " + " | ".join(str(k) for k in dims) + " |",
        "|---|" + "---|" * len(dims),
    ]
    for name, row in paired.items():
        cells = [
            f"{100 * c['difference']:+.2f} [{100 * c['low']:+.2f}, {100 * c['high']:+.2f}] "
            f"({c['first_only']}/{c['second_only']})"
            if (c := row.get(k))
            else "–"
            for k in dims
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _retrieval_lines(report: dict) -> list[str]:
    dims, lines = report["dims"], []
    header = ["| {} | " + " | ".join(str(k) for k in dims) + " |", "|---|" + "---|" * len(dims)]
    if "retrieval" in report:
        setup = report["retrieval_setup"]
        lines += [
            "",
            "### Retrieval (%) by representation size",
            "",
            f"Exact cosine search ({setup['backend']}). 1-NN: each of the {setup['queries']} validation vectors "
            f"against the {setup['database']} training vectors; R@k: among its k nearest other validation "
            f"vectors one has its class. RS: mean of {setup['rs_draws']} random subsets.",
            "",
        ]
        lines += [header[0].format("Method, metric \\ Dims"), header[1]]
        for method, row in report["retrieval"].items():
            for metric, label in RETRIEVAL_METRICS:
                lines.append(
                    f"| {method} {label} | "
                    + " | ".join(f"{100 * row[k][metric]:.2f}" if k in row else "–" for k in dims)
                    + " |"
                )
        lines += [
            "",
            f"### Storage and search time ({setup['database']} training vectors, exact top-10, "
            f"float32, {setup['backend']}; time measured here, best of 3)",
            "",
        ]
        lines += [header[0].format("Per vector \\ Dims"), header[1]]
        for key, label in STORAGE_ROWS:
            cells = [report["storage"][k][key] for k in dims]
            lines.append(
                f"| {label} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |"
            )
    if report.get("smallest_k"):
        lines += [
            "",
            f"### Smallest k within X points of the same method at k = {max(dims)}",
            "",
            "| Method | probe, 1 pt | probe, 5 pt | 1-NN, 1 pt | 1-NN, 5 pt |",
            "|---|---|---|---|---|",
        ]
        for method, row in report["smallest_k"].items():
            keys = ("accuracy_within_1pt", "accuracy_within_5pt", "1nn_within_1pt", "1nn_within_5pt")
            lines.append(f"| {method} | " + " | ".join(str(row.get(key) or "–") for key in keys) + " |")
    return lines


def _constant_and_spectrum_lines(report: dict) -> list[str]:
    lines = []
    if report.get("constant_share"):
        width = max(len(v) for v in report["constant_share"].values())
        lines += [
            "",
            "### How constant each feature is on the validation split: E[f]² / E[f²] (1 = constant)",
            "",
            "| Method \\ feature | " + " | ".join(str(i + 1) for i in range(width)) + " |",
            "|---|" + "---|" * width,
        ]
        for method, row in report["constant_share"].items():
            lines.append(f"| {method} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    if report.get("spectrum"):
        spec = report["spectrum"]
        lines += [
            "",
            "### k suggested by the Rayleigh–Ritz spectrum (beyond the trivial mode) vs k measured by the probe",
            "",
            f"Measured (smallest k within 1 / 5 points of RR at k = {max(report['dims'])}): "
            f"{spec['measured']['1pt'] or '–'} / {spec['measured']['5pt'] or '–'}.",
            "",
            "| share of | k | on the evaluated sizes | = measured 1 pt | = measured 5 pt |",
            "|---|---|---|---|---|",
        ]
        for key, row in spec["suggested"].items():
            name, share = key.rsplit("_", 1)
            label = f"{100 * float(share):g} % of {'Σλ²' if name == 'sum_sq' else 'Σλ'}"
            lines.append(
                f"| {label} | {row['k']} | {row['k_on_grid']} | {'yes' if row['agrees_1pt'] else 'no'} | "
                f"{'yes' if row['agrees_5pt'] else 'no'} |"
            )
    cuts = report.get("rr_cuts")  # which cuts of the export the data determine (eigtrain.export.prefixes)
    if cuts:
        bad = ", ".join(str(k) for k in cuts["undetermined"]) or "none"
        tested, width = cuts.get("tested"), cuts.get("features")
        untested = (
            f" Cuts after features {tested + 1}–{width - 1}: not tested."
            if tested and width and tested < width - 1
            else ""
        )
        lines += [
            "",
            f"RR cuts the data do not determine (prefix sizes whose top-k is one of several equally good): {bad}.{untested}",
        ]
    if (report.get("rr_ties") or {}).get("groups"):
        spans = ", ".join(f"{a}–{b}" for a, b in report["rr_ties"]["groups"])
        lines += [
            "",
            f"RR features {spans}: reordered by the embedding's variance (ties=variance, not the kernel's order).",
        ]
    return lines


def _plot(report: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    for method, row in report["accuracy"].items():
        ks = [k for k in report["dims"] if k in row]
        ax.plot(ks, [100 * row[k] for k in ks], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("representation size k")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title or "accuracy vs dimension", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    safe_files.write_with(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)


def _plot_retrieval(report: dict, path: Path, title: str) -> None:
    """Probe accuracy (solid) and 1-NN / R@1 retrieval (dashed, dotted) vs k; fp32 bytes per vector on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    dims = report["dims"]
    for i, (method, row) in enumerate(report["accuracy"].items()):
        color = f"C{i}"
        ks = [k for k in dims if k in row]
        ax.plot(ks, [100 * row[k] for k in ks], marker="o", color=color, label=f"{method} probe")
        for metric, style in (("1nn", "--"), ("recall@1", ":")):
            ret = report["retrieval"].get(method, {})
            ks = [k for k in dims if k in ret]
            ax.plot(
                ks,
                [100 * ret[k][metric] for k in ks],
                style,
                marker=".",
                color=color,
                label=f"{method} {dict(RETRIEVAL_METRICS)[metric]}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(dims, labels=[str(k) for k in dims], minor=False)
    ax.minorticks_off()
    ax.set_xlabel("representation size k")
    ax.set_ylabel("accuracy / recall (%)")
    top = ax.secondary_xaxis("top", functions=(lambda k: np.multiply(k, 4), lambda b: np.divide(b, 4)))
    top.set_xticks([4 * k for k in dims], labels=[str(4 * k) for k in dims])
    top.minorticks_off()
    top.set_xlabel("bytes per vector, fp32 (fp16: 1/2, int8: 1/4)")
    ax.set_title(title or "accuracy and retrieval vs dimension", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    safe_files.write_with(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
