"""eigtrain-eval's report: markdown table, CSV, JSON and the two PNG plots (accuracy and retrieval vs dimension)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from eigtrain import safe_files
from eigtrain.evaluate import report_sections
from eigtrain.runs.output_dirs import EVAL_ENTRIES, check_output_dir
from eigtrain.runs.provenance import provenance_line
from eigtrain.runs.run_step import describe

PROBE_TITLE = "Linear probe accuracy (%) by representation size"
RETRIEVAL_TITLE = "Probe accuracy, 1-NN accuracy and hit@1 (%) by representation size"
LABEL_FREE_TITLE = "Label-free evaluation by representation size"


def write_report(report: dict, out_dir: str | os.PathLike, name: str = "") -> dict[str, Path]:
    """Markdown + CSV table laid out like the paper's appendix tables, a JSON dump, and the PNG plots, each titled
    with what it shows and `name` (the run's or the features file's); `out_dir` must be new, empty or an earlier
    report's (its files are replaced; anything else there is refused)."""
    out = Path(out_dir)
    check_output_dir(out, EVAL_ENTRIES, "out")
    safe_files.make_dir(out)
    json_path = out / "report.json"  # the numbers first: a report that fails to render loses none of the work
    safe_files.write_text(json_path, json.dumps(report, indent=2, default=str) + "\n")
    paths = {"markdown": out / "table.md", "csv": out / "table.csv", "json": json_path}
    if report.get("label_free"):  # no labels: no probe table (eigtrain.evaluate.label_free)
        lines = _header_lines(report, f"{LABEL_FREE_TITLE} — {name}" if name else LABEL_FREE_TITLE)
        lines += report_sections.label_free_lines(report) + _constant_and_spectrum_lines(report)
        rows = list(report_sections.label_free_csv_rows(report))
    else:
        lines = _probe_lines(report, f"{PROBE_TITLE} — {name}" if name else PROBE_TITLE)
        rows = list(_extra_rows(report, report["accuracy"]))
    lines += report_sections.funnel_lines(report)
    safe_files.write_text(paths["markdown"], "\n".join(lines) + "\n")
    with safe_files.atomic_open(paths["csv"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", *report["dims"]])
        writer.writerows([label, *[row.get(k, "") for k in report["dims"]]] for label, row in rows)
        writer.writerows(report_sections.funnel_csv_rows(report))
    if "accuracy" in report:
        paths["plot"] = out / "accuracy_vs_dim.png"
        _plot(report, paths["plot"], name)
    if "retrieval" in report or "neighbour_recall" in report:
        paths["retrieval_plot"] = out / "retrieval_vs_dim.png"
        plot = _plot_retrieval if "retrieval" in report else report_sections.plot_neighbour_recall
        plot(report, paths["retrieval_plot"], name)
    if report.get("retrieval_funnels"):
        paths["funnel_plot"] = out / "retrieval_funnels.png"
        report_sections.plot_funnels(report, paths["funnel_plot"], name)
    return paths


def _probe_lines(report: dict, title: str) -> list[str]:
    """table.md's sections for a labelled report: the probe table, RS draws, paired differences, the ordering
    check, kNN, retrieval, smallest k, constant features and the spectrum."""
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
    return lines + _retrieval_lines(report) + _constant_and_spectrum_lines(report)


def _header_lines(report: dict, title: str) -> list[str]:
    """The title, the probe, the data each split came from, the weights and the export's provenance (values read from
    someone's config or paths escaped to one line each)."""
    lines = [f"### {safe_files.one_line(title)}", ""]
    if "probe" in report:  # a label-free report has none
        probe_note = (
            "linear probe, SGD 50 epochs"
            if report["probe"] == "sgd"
            else "closed-form ridge probe (faster, not the paper's SGD probe)"
        )
        if report.get("probe_features") == "whitened":
            probe_note += ", on each method's first k features whitened on the training split (it scores their span)"
        lines += [f"Probe: {probe_note}.", ""]
    if report.get("data"):
        seen = " Embeddings l2-normalized, as the objective saw them." if report.get("input") == "l2_normalized" else ""
        data = {split: safe_files.one_line(report["data"][split]) for split in ("train", "test")}  # others' values
        roles = ("database", "queries") if report.get("label_free") else ("fitted on", "scored on")
        lines += [f"Data: {roles[0]} {data['train']}; {roles[1]} {data['test']}.{seen}", ""]
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

# hit@k: a same-class item among the k nearest (recall@k is the share of the exact top-k found: funnels, label_free)
RETRIEVAL_METRICS = (("1nn", "1-NN"), ("hit@1", "hit@1"), ("hit@10", "hit@10"))


def _extra_rows(report: dict, acc: dict):
    """(label, {k: cell}) rows of the CSV: accuracy, retrieval per method and metric, storage and time."""
    for method, row in acc.items():
        yield method, {k: f"{100 * v:.2f}" for k, v in row.items()}
    for method, row in report.get("retrieval", {}).items():
        for metric, label in RETRIEVAL_METRICS:
            yield f"{method} {label}", {k: f"{100 * v[metric]:.2f}" for k, v in row.items()}
    if "storage" in report:
        yield from report_sections.storage_csv_rows(report)


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
            f"against the {setup['database']} training vectors; hit@k: among its k nearest other validation "
            f"vectors one has its class (not recall@10, the share of an exact top-10 found). RS: mean of "
            f"{setup['rs_draws']} random subsets.",
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
        lines += report_sections.storage_lines(report)
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
    if report.get("spectrum") and not report.get("label_free"):  # label-free: no measured k (report_sections)
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


def _plot(report: dict, path: Path, name: str) -> None:
    plt, fig, ax = report_sections.figure((5, 3.5))
    for method, row in report["accuracy"].items():
        ks = [k for k in report["dims"] if k in row]
        ax.plot(ks, [100 * row[k] for k in ks], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="representation size k", ylabel="linear probe accuracy (%)")
    report_sections.finish(plt, fig, ax, path, PROBE_TITLE, name)


def _plot_retrieval(report: dict, path: Path, name: str) -> None:
    """Probe accuracy (solid), 1-NN accuracy (dashed) and hit@1 (dotted) vs k; fp32 bytes per vector on top."""
    import numpy as np

    plt, fig, ax = report_sections.figure((6, 4))
    dims = report["dims"]
    for i, (method, row) in enumerate(report["accuracy"].items()):
        color = f"C{i}"
        ks = [k for k in dims if k in row]
        ax.plot(ks, [100 * row[k] for k in ks], marker="o", color=color, label=f"{method} probe")
        for metric, style in (("1nn", "--"), ("hit@1", ":")):
            ret = report["retrieval"].get(method, {})
            ks = [k for k in dims if k in ret]
            label = f"{method} {dict(RETRIEVAL_METRICS)[metric]}"
            ax.plot(ks, [100 * ret[k][metric] for k in ks], style, marker=".", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(dims, labels=[str(k) for k in dims], minor=False)
    ax.minorticks_off()
    ax.set(xlabel="representation size k", ylabel="probe accuracy, 1-NN accuracy, hit@1 (%)")
    top = ax.secondary_xaxis("top", functions=(lambda k: np.multiply(k, 4), lambda b: np.divide(b, 4)))
    top.set_xticks([4 * k for k in dims], labels=[str(4 * k) for k in dims])
    top.minorticks_off()
    top.set_xlabel("bytes per vector, fp32 (fp16: 1/2, int8: 1/4)")
    report_sections.finish(plt, fig, ax, path, RETRIEVAL_TITLE, name, legend=dict(fontsize=6, ncol=2))
