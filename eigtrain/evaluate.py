"""Adaptive-dimension evaluation: what each dimension of an embedding is worth.

At each dimension k in {4, 8, ..., d}, a linear probe on frozen features for:
  RR  the first k Rayleigh-Ritz ordered features of the full embedding,
  JN  the first k coordinates of a joint-nesting encoder,
  FF  separately trained k-dimensional encoders (when given),
  RS  k random coordinates of the full embedding, averaged over many draws (trained in parallel),
  PCA the first k principal components of the same full embedding (the unsupervised baseline),
plus an ordering check (RR top-k vs bottom-k) and kNN accuracy. At every k also: retrieval (1-NN accuracy
against the training split, recall@{1,10} within the validation split; eigtrain.retrieval), bytes per
vector (fp32/fp16/int8), measured exact-search time per query, and the smallest k within 1 and 5 points of
each method's accuracy at full dimension.

Probe: the paper's protocol is a linear classifier trained 50 epochs with SGD (lr 0.1, momentum 0.9,
weight decay 1e-4, cosine schedule) on frozen, here standardized, features. `probe="closed_form"` is a
faster ridge least-squares classifier on one-hot targets; it is stated as such in every table.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from . import retrieval
from .dist import resolve_env, select_device
from .objectives.nesting import mrl_prefixes
from .rayleigh_ritz import spectral_k_report
from .output_dirs import EVAL_ENTRIES, check_output_dir
from .redact import redact_url

F32 = torch.float32


def dims_for(d: int) -> list[int]:
    """{4, 8, 16, ..., d} (d always included): the paper's representation sizes."""
    return mrl_prefixes(d)


def _standardize(train: torch.Tensor, test: torch.Tensor):
    mean, std = train.mean(-2, keepdim=True), train.std(-2, keepdim=True).clamp_min(1e-8)
    return (train - mean) / std, (test - mean) / std


def probe_accuracy(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    test_x: torch.Tensor,
    test_y: torch.Tensor,
    probe: str = "sgd",
    epochs: int = 50,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-4,
    batch_size: int = 256,
    ridge: float = 1e-3,
    seed: int = 0,
) -> torch.Tensor:
    """Test accuracy of linear probes. Inputs (n, k) or a stack of R independent problems (R, n, k);
    returns a tensor of R accuracies (R = 1 for 2-D input). The R probes train in parallel."""
    if probe not in ("sgd", "closed_form"):
        raise ValueError(f"probe={probe!r} is unknown; allowed: sgd, closed_form")
    squeeze = train_x.ndim == 2
    if squeeze:
        train_x, test_x = train_x[None], test_x[None]
    train_x, test_x = _standardize(train_x.to(F32), test_x.to(F32))
    classes = int(max(train_y.max(), test_y.max())) + 1
    reps, n, k = train_x.shape
    xb = torch.cat([train_x, torch.ones(reps, n, 1)], -1)  # bias column
    onehot = torch.nn.functional.one_hot(train_y.long(), classes).to(F32)

    if probe == "closed_form":
        gram = xb.transpose(1, 2) @ xb + ridge * n * torch.eye(k + 1)
        w = torch.linalg.solve(gram, xb.transpose(1, 2) @ onehot.expand(reps, n, classes))
    else:  # softmax regression; the gradient is written out (no autograd) to keep the probe cheap
        gen = torch.Generator().manual_seed(seed)
        w = torch.zeros(reps, k + 1, classes)
        velocity = torch.zeros_like(w)
        total, step = epochs * math.ceil(n / batch_size), 0
        for _ in range(epochs):
            order = torch.randperm(n, generator=gen)
            for s in range(0, n, batch_size):
                idx = order[s : s + batch_size]
                x = xb[:, idx]
                residual = torch.softmax(x @ w, -1) - onehot[idx]
                grad = x.transpose(1, 2) @ residual / len(idx) + weight_decay * w
                velocity.mul_(momentum).add_(grad)
                w.sub_(velocity, alpha=lr * 0.5 * (1 + math.cos(math.pi * step / total)))  # cosine schedule
                step += 1
    test_b = torch.cat([test_x, torch.ones(reps, len(test_y), 1)], -1)
    acc = ((test_b @ w).argmax(-1) == test_y.long()).to(F32).mean(-1)
    return acc


def _row_blocks(x: torch.Tensor, block: int = 65536):
    """float64 copies of `block` rows at a time (never the whole matrix in float64)."""
    for s in range(0, len(x), block):
        yield x[s : s + block].to(torch.float64)


def fit_pca(train: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, components (d, d) as columns, variances), components by decreasing variance, from the float64
    covariance; each component's largest-magnitude entry is positive (deterministic signs)."""
    n, d = train.shape
    mean = sum(b.sum(0) for b in _row_blocks(train)) / n
    scatter = torch.zeros(d, d, dtype=torch.float64)
    for b in _row_blocks(train):
        scatter += (b - mean).T @ (b - mean)
    variances, components = torch.linalg.eigh(scatter / max(n - 1, 1))
    variances, components = variances.flip(0), components.flip(1)
    signs = torch.sign(components.gather(0, components.abs().argmax(0, keepdim=True)))
    return mean, components * torch.where(signs == 0, 1.0, signs), variances


def pca_features(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both splits projected on the training embedding's principal components (float32)."""
    mean, components, _ = fit_pca(train)
    project = lambda x: torch.cat([((b - mean) @ components).float() for b in _row_blocks(x)])  # noqa: E731
    return project(train), project(test)


def smallest_k_within(row: Mapping[int, float], points: float) -> int | None:
    """The smallest k whose value is within `points` percentage points of the value at the largest k."""
    if not row:
        return None
    full = row[max(row)]
    return min(k for k, v in row.items() if v >= full - points / 100)


def knn_accuracy(train_x, train_y, test_x, test_y, k: int = 20, temperature: float = 0.07) -> float:
    """Weighted cosine kNN (the usual SSL protocol: k=20, weights exp(sim / 0.07))."""
    a = torch.nn.functional.normalize(train_x.to(F32), dim=1)
    b = torch.nn.functional.normalize(test_x.to(F32), dim=1)
    classes = int(max(train_y.max(), test_y.max())) + 1
    sims, idx = (b @ a.T).topk(min(k, len(a)), dim=1)
    votes = torch.zeros(len(b), classes).scatter_add_(1, train_y.long()[idx], (sims / temperature).exp())
    return (votes.argmax(1) == test_y.long()).to(F32).mean().item()


def adaptive_dimension_table(
    train: Mapping[str, torch.Tensor],
    test: Mapping[str, torch.Tensor],
    train_y: torch.Tensor,
    test_y: torch.Tensor,
    dims: list[int],
    fixed: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    random_draws: int = 50,
    probe: str = "sgd",
    seed: int = 0,
    pca: bool = True,
    retrieval_backend: str | None = "auto",
    retrieval_draws: int = 5,
    **probe_kwargs,
) -> dict:
    """Accuracy per method and dimension.

    train/test hold "rr" (Rayleigh-Ritz ordered features), optionally "jn" (a joint-nesting encoder's
    features) and "raw" (the unordered full features, for random selection and the PCA baseline). fixed maps
    k to the (train, test) features of a separately trained k-dimensional encoder. retrieval_backend=None
    skips retrieval and timing; RS retrieval is the mean over `retrieval_draws` random subsets.
    """
    train, test = dict(train), dict(test)
    if pca and "raw" in train:
        train["pca"], test["pca"] = pca_features(train["raw"], test["raw"])
    acc = lambda tr, te: probe_accuracy(tr, train_y, te, test_y, probe=probe, seed=seed, **probe_kwargs)  # noqa: E731
    results: dict[str, dict[int, float]] = {}
    prefixes = {label: name for name, label in PREFIX_METHODS if name in train}
    first_k = lambda name: {k: acc(train[name][:, :k], test[name][:, :k]).item() for k in dims}  # noqa: E731
    for label in ("RR", RR_PAPER, "JN"):  # table order: RR, RR (paper), JN, FF, PCA, RS
        if label in prefixes:
            results[label] = first_k(prefixes[label])
    if fixed:
        results["FF"] = {k: acc(*fixed[k]).item() for k in dims if k in fixed}
    if "PCA" in prefixes:
        results["PCA"] = first_k("pca")
    subsets = {}
    if "raw" in train and random_draws > 0:
        gen = torch.Generator().manual_seed(seed)
        d = train["raw"].shape[1]
        results["RS"] = {}
        for k in dims:
            subsets[k] = torch.stack([torch.randperm(d, generator=gen)[:k] for _ in range(random_draws)])
            results["RS"][k] = acc(train["raw"][:, subsets[k]].permute(1, 0, 2), test["raw"][:, subsets[k]].permute(1, 0, 2)).mean().item()
    ordering = {}
    if "rr" in train:
        d = train["rr"].shape[1]
        for k in dims:
            if k < d:
                ordering[k] = {
                    "top": results["RR"][k],
                    "bottom": acc(train["rr"][:, d - k :], test["rr"][:, d - k :]).item(),
                }
    knn = {name: knn_accuracy(train[name], train_y, test[name], test_y) for name in train}
    report = {"dims": dims, "probe": probe, "accuracy": results, "ordering": ordering, "knn": knn,
              "constant_share": constant_shares(test, prefixes, fixed)}
    if retrieval_backend is not None:
        report.update(_retrieval_report(train, test, train_y, test_y, dims, prefixes, fixed, subsets,
                                        retrieval_draws, retrieval.resolve_backend(retrieval_backend)))
    one_nn = {m: {k: v["1nn"] for k, v in r.items()} for m, r in report.get("retrieval", {}).items()}
    report["smallest_k"] = {m: {**_within(results.get(m), "accuracy"), **_within(one_nn.get(m), "1nn")} for m in results}
    return report


def constant_share(features: torch.Tensor) -> list[float]:
    """Per feature, the share of its second moment that is constant across the set: E[f]^2 / E[f^2] (1: a
    constant feature, 0: mean zero)."""
    f = features.double()
    return (f.mean(0) ** 2 / (f.pow(2).mean(0)).clamp_min(1e-300)).tolist()


def constant_shares(test, prefixes, fixed, first: int = 8) -> dict[str, list[float]]:
    """constant_share of the first `first` features of every method on the validation split (FF: each k's
    model, raw: the embedding's own coordinates, what RS draws from)."""
    rows = {label: constant_share(test[name][:, :first]) for label, name in prefixes.items()}
    rows.update({f"FF k={k}": constant_share(te[:, :first]) for k, (_, te) in sorted((fixed or {}).items())})
    if "raw" in test:
        rows["raw"] = constant_share(test["raw"][:, :first])
    return rows


def spectrum_report(eigenvalues: torch.Tensor, dims: list[int], measured: Mapping[str, int | None]) -> dict:
    """The k the export's eigenvalues suggest (beyond the trivial mode), rounded up to the evaluated sizes, beside
    the k the probes measured (smallest k within 1 / 5 points of RR at full size): agree = same size."""
    on_grid = lambda k: min((d for d in dims if d >= k), default=max(dims))  # noqa: E731
    rows = {}
    for key, k in spectral_k_report(eigenvalues).items():
        rows[key] = {"k": k, "k_on_grid": on_grid(k),
                     **{f"agrees_{x}pt": on_grid(k) == measured.get(f"accuracy_within_{x}pt") for x in (1, 5)}}
    return {"suggested": rows, "measured": {f"{x}pt": measured.get(f"accuracy_within_{x}pt") for x in (1, 5)}}


def _within(row: Mapping[int, float] | None, metric: str) -> dict[str, int | None]:
    return {f"{metric}_within_{x}pt": smallest_k_within(row, x) for x in (1, 5)} if row else {}


def _retrieval_report(train, test, train_y, test_y, dims, prefixes, fixed, subsets, draws, backend) -> dict:
    """Retrieval per method and k; storage and measured search time per k (on the first ordered features)."""
    metrics = lambda tr, te: retrieval.retrieval_metrics(tr, train_y, te, test_y, backend=backend)  # noqa: E731
    rows: dict[str, dict[int, dict[str, float]]] = {}
    for label, name in prefixes.items():
        rows[label] = {k: metrics(train[name][:, :k], test[name][:, :k]) for k in dims}
    if fixed:
        rows["FF"] = {k: metrics(*fixed[k]) for k in dims if k in fixed}
    if subsets and draws > 0:
        rows["RS"] = {}
        for k in dims:
            runs = [metrics(train["raw"][:, s], test["raw"][:, s]) for s in subsets[k][:draws]]
            rows["RS"][k] = {m: sum(r[m] for r in runs) / len(runs) for m in runs[0]}
    timed = next(iter(prefixes.values()), "raw")  # search time depends on k and the sizes, not on the method
    seconds = {k: retrieval.search_seconds_per_query(train[timed][:, :k], test[timed][:, :k], 10, backend) for k in dims}
    storage = {k: {**retrieval.bytes_per_vector(k), "search_us_per_query": 1e6 * seconds[k]} for k in dims}
    return {"retrieval": rows, "storage": storage,
            "retrieval_setup": {"backend": backend, "database": len(train_y), "queries": len(test_y), "rs_draws": draws}}


def write_report(report: dict, out_dir: str | os.PathLike, title: str = "") -> dict[str, Path]:
    """Markdown + CSV table laid out like the paper's appendix tables, a JSON dump, and the PNG plot; `out_dir` must
    be new, empty or an earlier report's (its files are replaced; anything else there is refused)."""
    out = Path(out_dir)
    check_output_dir(out, EVAL_ENTRIES, "out")
    out.mkdir(parents=True, exist_ok=True)
    dims, acc = report["dims"], report["accuracy"]
    probe_note = "linear probe, SGD 50 epochs" if report["probe"] == "sgd" else "closed-form ridge probe (faster, not the paper's SGD probe)"
    lines = [f"### {title or 'Linear probe accuracy (%) by representation size'}", "", f"Probe: {probe_note}.", ""]
    if report.get("data"):
        lines += [f"Data: fitted on {report['data']['train']}; scored on {report['data']['test']}.", ""]
    lines.append("| Methods \\ Dims | " + " | ".join(str(k) for k in dims) + " |")
    lines.append("|---|" + "---|" * len(dims))
    for method, row in acc.items():
        cells = [f"{100 * row[k]:.2f}" if k in row else "–" for k in dims]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    if report["ordering"]:
        lines += ["", "Ordering check (RR, first k vs last k features):", ""]
        lines.append("| k | top-k | bottom-k |")
        lines.append("|---|---|---|")
        for k, row in report["ordering"].items():
            lines.append(f"| {k} | {100 * row['top']:.2f} | {100 * row['bottom']:.2f} |")
    if report["knn"]:
        lines += ["", "kNN accuracy (k=20, cosine, full dimension): " + ", ".join(f"{n}: {100 * v:.2f}" for n, v in report["knn"].items())]
    lines += _retrieval_lines(report)
    lines += _constant_and_spectrum_lines(report)
    paths = {"markdown": out / "table.md", "csv": out / "table.csv", "json": out / "report.json", "plot": out / "accuracy_vs_dim.png"}
    paths["markdown"].write_text("\n".join(lines) + "\n")
    with open(paths["csv"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", *dims])
        for method, row in _extra_rows(report, acc):
            writer.writerow([method, *[row.get(k, "") for k in dims]])
    paths["json"].write_text(json.dumps(report, indent=2, default=str) + "\n")
    _plot(report, paths["plot"], title)
    if "retrieval" in report:
        paths["retrieval_plot"] = out / "retrieval_vs_dim.png"
        _plot_retrieval(report, paths["retrieval_plot"], title)
    return paths


RR_PAPER = "RR (paper)"  # Rayleigh-Ritz in the paper's convention: the constant mode kept as feature 1
PREFIX_METHODS = (("rr", "RR"), ("rr_paper", RR_PAPER), ("jn", "JN"), ("pca", "PCA"))

RETRIEVAL_METRICS = (("1nn", "1-NN"), ("recall@1", "R@1"), ("recall@10", "R@10"))
STORAGE_ROWS = (("fp32", "bytes/vector fp32"), ("fp16", "bytes/vector fp16"), ("int8", "bytes/vector int8"),
                ("search_us_per_query", "search µs/query"))


def _extra_rows(report: dict, acc: dict):
    """(label, {k: cell}) rows of the CSV: accuracy, retrieval per method and metric, storage and time."""
    for method, row in acc.items():
        yield method, {k: f"{100 * v:.2f}" for k, v in row.items()}
    for method, row in report.get("retrieval", {}).items():
        for metric, label in RETRIEVAL_METRICS:
            yield f"{method} {label}", {k: f"{100 * v[metric]:.2f}" for k, v in row.items()}
    for key, label in STORAGE_ROWS:
        yield label, {k: (f"{v[key]:.2f}" if isinstance(v[key], float) else v[key]) for k, v in report.get("storage", {}).items()}


def _retrieval_lines(report: dict) -> list[str]:
    dims, lines = report["dims"], []
    header = ["| {} | " + " | ".join(str(k) for k in dims) + " |", "|---|" + "---|" * len(dims)]
    if "retrieval" in report:
        setup = report["retrieval_setup"]
        lines += ["", "### Retrieval (%) by representation size", "",
                  f"Exact cosine search ({setup['backend']}). 1-NN: each of the {setup['queries']} validation vectors "
                  f"against the {setup['database']} training vectors; R@k: among its k nearest other validation "
                  f"vectors one has its class. RS: mean of {setup['rs_draws']} random subsets.", ""]
        lines += [header[0].format("Method, metric \\ Dims"), header[1]]
        for method, row in report["retrieval"].items():
            for metric, label in RETRIEVAL_METRICS:
                lines.append(f"| {method} {label} | " + " | ".join(f"{100 * row[k][metric]:.2f}" if k in row else "–" for k in dims) + " |")
        lines += ["", f"### Storage and search time ({setup['database']} training vectors, exact top-10, "
                      f"float32, {setup['backend']}; time measured here, best of 3)", ""]
        lines += [header[0].format("Per vector \\ Dims"), header[1]]
        for key, label in STORAGE_ROWS:
            cells = [report["storage"][k][key] for k in dims]
            lines.append(f"| {label} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    if report.get("smallest_k"):
        lines += ["", f"### Smallest k within X points of the same method at k = {max(dims)}", "",
                  "| Method | probe, 1 pt | probe, 5 pt | 1-NN, 1 pt | 1-NN, 5 pt |", "|---|---|---|---|---|"]
        for method, row in report["smallest_k"].items():
            keys = ("accuracy_within_1pt", "accuracy_within_5pt", "1nn_within_1pt", "1nn_within_5pt")
            lines.append(f"| {method} | " + " | ".join(str(row.get(key) or "–") for key in keys) + " |")
    return lines


def _constant_and_spectrum_lines(report: dict) -> list[str]:
    lines = []
    if report.get("constant_share"):
        width = max(len(v) for v in report["constant_share"].values())
        lines += ["", "### How constant each feature is on the validation split: E[f]² / E[f²] (1 = constant)", "",
                  "| Method \\ feature | " + " | ".join(str(i + 1) for i in range(width)) + " |", "|---|" + "---|" * width]
        for method, row in report["constant_share"].items():
            lines.append(f"| {method} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    if report.get("spectrum"):
        spec = report["spectrum"]
        lines += ["", "### k suggested by the Rayleigh–Ritz spectrum (beyond the trivial mode) vs k measured by the probe",
                  "", f"Measured (smallest k within 1 / 5 points of RR at k = {max(report['dims'])}): "
                  f"{spec['measured']['1pt'] or '–'} / {spec['measured']['5pt'] or '–'}.", "",
                  "| share of | k | on the evaluated sizes | = measured 1 pt | = measured 5 pt |", "|---|---|---|---|---|"]
        for key, row in spec["suggested"].items():
            name, share = key.rsplit("_", 1)
            label = f"{100 * float(share):g} % of {'Σλ²' if name == 'sum_sq' else 'Σλ'}"
            lines.append(f"| {label} | {row['k']} | {row['k_on_grid']} | {'yes' if row['agrees_1pt'] else 'no'} | "
                         f"{'yes' if row['agrees_5pt'] else 'no'} |")
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
    fig.savefig(path)
    plt.close(fig)


def _plot_retrieval(report: dict, path: Path, title: str) -> None:
    """Probe accuracy (solid) and 1-NN / R@1 retrieval (dashed, dotted) vs k; fp32 bytes per vector on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    dims = report["dims"]
    for i, (method, row) in enumerate(report["accuracy"].items()):
        color = f"C{i}"
        ks = [k for k in dims if k in row]
        ax.plot(ks, [100 * row[k] for k in ks], marker="o", color=color, label=f"{method} probe")
        for metric, style in (("1nn", "--"), ("recall@1", ":")):
            ret = report["retrieval"].get(method, {})
            ks = [k for k in dims if k in ret]
            ax.plot(ks, [100 * ret[k][metric] for k in ks], style, marker=".", color=color,
                    label=f"{method} {dict(RETRIEVAL_METRICS)[metric]}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(dims, labels=[str(k) for k in dims], minor=False)
    ax.minorticks_off()
    ax.set_xlabel("representation size k")
    ax.set_ylabel("accuracy / recall (%)")
    top = ax.secondary_xaxis("top", functions=(lambda k: 4 * k, lambda b: b / 4))
    top.set_xticks([4 * k for k in dims], labels=[str(4 * k) for k in dims])
    top.minorticks_off()
    top.set_xlabel("bytes per vector, fp32 (fp16: 1/2, int8: 1/4)")
    ax.set_title(title or "accuracy and retrieval vs dimension", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# -- eigtrain-eval ---------------------------------------------------------------------------------
USAGE = """eigtrain-eval: adaptive-dimension evaluation of a trained run or of stored features.

    eigtrain-eval run_dir=DIR [rr=DIR] [jn_run_dir=DIR] [ff_run_dirs=[DIR4,DIR8]] [probe=sgd|closed_form]
                  [random_draws=50] [dims=[4,8,16]] [train_split=train] [test_split=val] [out=DIR]
                  [pca=true] [retrieval=auto|torch|faiss|none] [retrieval_draws=5]
                  [data.val_shards=PATTERN] [data.shards=PATTERN] [data.allow_pipe=true]
    eigtrain-eval features=FILE.npz rr=DIR out=DIR     # arrays train_z, train_y, test_z, test_y

RR uses the Rayleigh-Ritz export (default run_dir/rr, written by eigtrain-rr); JN is the run's own
coordinates when it was trained with joint nesting, or those of jn_run_dir; FF are runs trained at each
smaller dimension; RS are random subsets of the run's coordinates; PCA the principal components of the
same embedding. At every size: retrieval (1-NN, recall@1/10), bytes per vector, search time per query.
Writes table.md, table.csv, report.json, accuracy_vs_dim.png and retrieval_vs_dim.png; they name the data
each split came from. A run trained on data.shards has a validation split only with data.val_shards (its
config's, or given here); the training shards are never scored as validation. data.shards / data.val_shards
given here replace the run's; a pipe: source in the run's saved config runs only with data.allow_pipe=true.
"""


@dataclass
class EvalDataConfig:
    """The command line's data sources for the runs evaluated (None: each run's saved config.yaml)."""

    shards: Any = None
    val_shards: Any = None
    shard_index: str | None = None
    allow_pipe: bool = False  # run pipe: sources read back from a run's saved config.yaml


@dataclass
class EvalConfig:
    run_dir: str | None = None
    features: str | None = None
    rr: str | None = None
    jn_run_dir: str | None = None
    ff_run_dirs: list[str] = field(default_factory=list)
    train_split: str = "train"
    test_split: str = "val"
    probe: str = "sgd"
    random_draws: int = 50
    dims: list[int] | None = None
    out: str | None = None
    device: str = "cpu"
    seed: int = 0
    pca: bool = True
    retrieval: str = "auto"  # auto (FAISS when installed, else torch) | torch | faiss | none
    retrieval_draws: int = 5
    data: EvalDataConfig = field(default_factory=EvalDataConfig)


def _load_features(path: str):
    import numpy as np

    if not Path(path).is_file():
        raise FileNotFoundError(f"features file {path} does not exist")
    with np.load(path) as data:
        missing = [k for k in ("train_z", "train_y", "test_z", "test_y") if k not in data]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}")
        return tuple(torch.from_numpy(data[k]) for k in ("train_z", "train_y", "test_z", "test_y"))


def evaluate(cfg) -> tuple[dict, dict]:
    from .embed import check_split, command_line_data, embed_split, open_run
    from safetensors import safe_open

    from .export import load_head

    if bool(cfg.run_dir) == bool(cfg.features):
        raise ValueError("give exactly one of run_dir= or features=")
    if cfg.out:  # before any work (write_report checks again): never write into a directory of someone else's
        check_output_dir(cfg.out, EVAL_ENTRIES, "out")
    device = str(select_device(resolve_env(), cfg.device))  # this task's GPU, bound as the trainer binds it
    if cfg.features:
        train_z, train_y, test_z, test_y = _load_features(cfg.features)
        nested, out = False, Path(cfg.out or Path(cfg.features).with_suffix(""))
        sources, jn, ffs = {"train": f"{cfg.features}: train_z", "test": f"{cfg.features}: test_z"}, None, []
    else:
        data = command_line_data(cfg.data)
        runs = [open_run(d, device=device, data=data) for d in (cfg.run_dir, cfg.jn_run_dir, *cfg.ff_run_dirs) if d]
        # every run's splits are checked before any is embedded: a refusal costs no work
        checked = [{"train": check_split(r, cfg.train_split), "test": check_split(r, cfg.test_split)} for r in runs]
        run, sources = runs[0], checked[0]
        jn, ffs = (runs[1] if cfg.jn_run_dir else None), runs[1 + bool(cfg.jn_run_dir):]
        (train_z, train_y), (test_z, test_y) = (embed_split(run, s, device=device) for s in (cfg.train_split, cfg.test_split))
        nested, out = run.cfg.nesting.mode != "none", Path(cfg.out or run.run_dir / "eval")
    train, test = {"raw": train_z}, {"raw": test_z}
    rr_dir = cfg.rr or (Path(cfg.run_dir) / "rr" if cfg.run_dir else None)
    if rr_dir and (Path(rr_dir) / "rr.safetensors").exists():
        head = load_head(rr_dir, dtype=torch.float64)
        if head.transform.shape[0] != train_z.shape[1]:  # e.g. rr= another model's export: say so, not torch's shapes
            raise ValueError(f"the Rayleigh-Ritz export {rr_dir} was fitted on {head.transform.shape[0]}-dimensional "
                             f"embeddings; this run's encoder gives {train_z.shape[1]} (rr= must be this run's export)")
        train["rr"], test["rr"] = head(train_z.double()).float(), head(test_z.double()).float()
        if "paper_transform" in safe_open(str(Path(rr_dir) / "rr.safetensors"), "pt").keys():  # both conventions
            paper = load_head(rr_dir, dtype=torch.float64, convention="paper")
            train["rr_paper"], test["rr_paper"] = paper(train_z.double()).float(), paper(test_z.double()).float()
    elif cfg.rr:
        raise FileNotFoundError(f"no Rayleigh-Ritz export at {cfg.rr} (run eigtrain-rr first)")
    if nested:
        train["jn"], test["jn"] = train_z, test_z
    if jn is not None:
        train["jn"], test["jn"] = (embed_split(jn, s, device=device)[0] for s in (cfg.train_split, cfg.test_split))
    fixed = {}
    for ff in ffs:
        fixed[int(ff.cfg.dim)] = tuple(embed_split(ff, s, device=device)[0] for s in (cfg.train_split, cfg.test_split))
    dims = list(cfg.dims) if cfg.dims else dims_for(train_z.shape[1])
    backend = None if cfg.retrieval == "none" else retrieval.resolve_backend(cfg.retrieval)
    report = adaptive_dimension_table(train, test, train_y, test_y, dims, fixed=fixed, random_draws=cfg.random_draws,
                                      probe=cfg.probe, seed=cfg.seed, pca=cfg.pca, retrieval_backend=backend,
                                      retrieval_draws=cfg.retrieval_draws)
    report["data"] = sources  # which data each split came from (URLs without credentials)
    if "rr" in train:  # the k the export's spectrum suggests, beside the k the probes measured
        report["spectrum"] = spectrum_report(head.eigenvalues, dims, report["smallest_k"].get("RR", {}))
    title = f"Accuracy (%) by representation size — {Path(cfg.run_dir or cfg.features).name}"
    return report, write_report(report, out, title)


def main(argv: list[str] | None = None) -> int:
    import sys

    from .cli import compose_dataclass

    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        cfg = compose_dataclass(EvalConfig, args)
        report, paths = evaluate(cfg)
    except (ValueError, OSError, RuntimeError) as error:  # OSError: unreadable shards; RuntimeError: max_corrupt
        print(redact_url(f"eigtrain-eval: {error}"), file=sys.stderr)  # e.g. a corrupt sample's signed shard URL
        return 2
    print(paths["markdown"].read_text())
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return 0
