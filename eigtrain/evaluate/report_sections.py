"""Sections of eigtrain-eval's report beside the probe table: storage and search time, the retrieval funnels
(table.md rows, a block of table.csv, retrieval_funnels.png) and the label-free report (eigtrain.evaluate.label_free).

Two measures, two names: hit@k (a same-class item among the k nearest; the labelled retrieval rows) and recall@10
(the share of an exact full-size top-10 a search returns; funnels and label-free rows)."""

from __future__ import annotations

from pathlib import Path

from eigtrain import safe_files

STORAGE_ROWS = (
    ("fp32", "bytes/vector fp32"),
    ("fp16", "bytes/vector fp16"),
    ("int8", "bytes/vector int8"),
    ("search_us_per_query", "search µs/query"),
)
FUNNEL_COLUMNS = ("recall@10", "multiply-adds/query", "bytes/query", "mean stop k")
FUNNEL_TITLE = "Retrieval funnels: recall@10 against cost per query"
NEIGHBOUR_TITLE = "Label-free: neighbour recall@10 by representation size"


def _row(label: str, cells) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def storage_lines(report: dict) -> list[str]:
    """The bytes per vector and the measured search time at each k, with what was searched."""
    dims, setup = report["dims"], report.get("retrieval_setup") or report["neighbour_recall_setup"]
    lines = [
        "",
        f"### Storage and search time ({setup['database']} training vectors, exact top-10, "
        f"float32, {setup['backend']}; time measured here, best of 3)",
        "",
        _row("Per vector \\ Dims", (str(k) for k in dims)),
        "|---|" + "---|" * len(dims),
    ]
    for key, label in STORAGE_ROWS:
        cells = [report["storage"][k][key] for k in dims]
        lines.append(_row(label, (f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells)))
    return lines


def storage_csv_rows(report: dict):
    for key, label in STORAGE_ROWS:
        cells = {k: (f"{v[key]:.2f}" if isinstance(v[key], float) else v[key]) for k, v in report["storage"].items()}
        yield label, cells


def funnel_lines(report: dict) -> list[str]:
    """retrieval_funnels=true: one row per search (fixed prefixes, MRL's funnel, the spectrum's, the bound)."""
    funnels = report.get("retrieval_funnels")
    if not funnels:
        return []
    lines = [
        "",
        f"### {FUNNEL_TITLE} (RR features)",
        "",
        f"recall@10: the share of the {safe_files.one_line(funnels['reference'])} a search returns (validation "
        "queries against the training split); multiply-adds and bytes read per query are counted, not timed.",
        "",
        _row("Search", FUNNEL_COLUMNS),
        "|---|---:|---:|---:|---:|",
    ]
    for r in funnels["rows"]:
        lines.append(_row(safe_files.one_line(r["method"]), _funnel_cells(r)))
    return lines


def _funnel_cells(r: dict) -> list[str]:
    stop = f"{r['mean_stop_k']:.1f}" if "mean_stop_k" in r else "–"
    return [f"{r['recall@10']:.3f}", f"{r['macs_per_query']:,.0f}", f"{r['bytes_per_query']:,.0f}", stop]


def funnel_csv_rows(report: dict) -> list[list]:
    """A block of its own below the per-size rows (a blank row, then its header): funnels have no size columns."""
    funnels = report.get("retrieval_funnels")
    if not funnels:
        return []
    rows: list[list] = [[], ["retrieval funnel", *FUNNEL_COLUMNS]]
    for r in funnels["rows"]:
        rows.append([r["method"], f"{r['recall@10']:.4f}", r["macs_per_query"], r["bytes_per_query"]])
        rows[-1].append(r.get("mean_stop_k", ""))
    return rows


def label_free_lines(report: dict) -> list[str]:
    """The label-free report's markdown after its header: why, neighbour recall, storage, the spectrum."""
    dims = report["dims"]
    reason = safe_files.one_line(report["label_free"])
    lines = [f"{reason[:1].upper()}{reason[1:]}.", ""]
    if "neighbour_recall" in report:
        setup = report["neighbour_recall_setup"]
        lines += [
            f"### {NEIGHBOUR_TITLE} (%)",
            "",
            f"Cosine search of the {setup['queries']} validation vectors against the {setup['database']} training "
            f"vectors ({setup['backend']}): the share of the exact top-10 on all of a method's features that its "
            f"first k return. RS: mean of {setup['rs_draws']} random subsets of the embedding's coordinates.",
            "",
            _row("Method \\ Dims", (str(k) for k in dims)),
            "|---|" + "---|" * len(dims),
        ]
        for method, row in report["neighbour_recall"].items():
            lines.append(_row(f"{method} recall@10", (f"{100 * row[k]:.2f}" for k in dims)))
        lines += storage_lines(report)
    if report.get("eigenvalues"):
        shown = ", ".join(f"{v:.4g}" for v in report["eigenvalues"][:16])
        more = f" (first 16 of {len(report['eigenvalues'])})" if len(report["eigenvalues"]) > 16 else ""
        lines += ["", f"Rayleigh–Ritz eigenvalues, feature order{more}: {shown}."]
    if report.get("spectrum"):
        suggested = report["spectrum"]["suggested"]
        share = lambda key: f"{100 * float(key.rsplit('_', 1)[1]):g} % of {'Σλ²' if 'sq' in key else 'Σλ'}"  # noqa: E731
        cells = [f"{share(key)}: k = {row['k']}" for key, row in suggested.items()]
        lines += ["", "k holding a share of the spectrum beyond the trivial mode: " + "; ".join(cells) + "."]
    return lines


def label_free_csv_rows(report: dict):
    for method, row in report.get("neighbour_recall", {}).items():
        yield f"{method} recall@10", {k: f"{100 * v:.2f}" for k, v in row.items()}
    if "storage" in report:
        yield from storage_csv_rows(report)


def plot_neighbour_recall(report: dict, path: Path, name: str) -> None:
    """Label-free retrieval_vs_dim.png: neighbour recall@10 of each method against k."""
    plt, fig, ax = figure((5, 3.5))
    dims = report["dims"]
    for method, row in report["neighbour_recall"].items():
        ax.plot(dims, [100 * row[k] for k in dims], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(dims, labels=[str(k) for k in dims], minor=False)
    ax.minorticks_off()
    ax.set(xlabel="representation size k", ylabel="recall@10 of the full-size top-10 (%)", ylim=(0, 102))
    finish(plt, fig, ax, path, NEIGHBOUR_TITLE, name)


def plot_funnels(report: dict, path: Path, name: str) -> None:
    """retrieval_funnels.png: each search's recall@10 against its multiply-adds per query (log scale)."""
    plt, fig, ax = figure((6, 4))
    for i, r in enumerate(report["retrieval_funnels"]["rows"]):  # a legend, not labels: equal costs coincide
        marker = "os^Dv<>"[i % 7]
        ax.scatter([r["macs_per_query"]], [r["recall@10"]], color=f"C{i % 10}", marker=marker, label=r["method"])
    ax.set_xscale("log")
    ax.set(xlabel="multiply-adds per query", ylabel="recall@10 (share of the exact top-10)", ylim=(0, 1.05))
    finish(plt, fig, ax, path, FUNNEL_TITLE, name, legend=dict(fontsize=6, loc="lower right"))


def figure(size):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size, dpi=120)
    return plt, fig, ax


def finish(plt, fig, ax, path: Path, title: str, name: str, legend: dict | None = None) -> None:
    """The title (what the plot shows, then whose), grid and legend; the PNG written atomically."""
    ax.set_title(safe_files.one_line(f"{title} — {name}" if name else title), fontsize=9)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**(legend or {"fontsize": 7}))
    fig.tight_layout()
    safe_files.write_with(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
