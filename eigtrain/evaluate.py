"""Adaptive-dimension evaluation: what each dimension of an embedding is worth.

At each dimension k in {4, 8, ..., d}, a linear probe on frozen features for:
  RR  the first k Rayleigh-Ritz ordered features of the full embedding,
  JN  the first k coordinates of a joint-nesting encoder,
  FF  separately trained k-dimensional encoders (when given),
  RS  k random coordinates of the full embedding, averaged over many draws (trained in parallel),
plus an ordering check (RR top-k vs bottom-k) and kNN accuracy.

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
from typing import Mapping

import torch

from .objectives.nesting import mrl_prefixes

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
    **probe_kwargs,
) -> dict:
    """Accuracy per method and dimension.

    train/test hold "rr" (Rayleigh-Ritz ordered features), optionally "jn" (a joint-nesting encoder's
    features) and "raw" (the unordered full features, for random selection). fixed maps k to the
    (train, test) features of a separately trained k-dimensional encoder.
    """
    acc = lambda tr, te: probe_accuracy(tr, train_y, te, test_y, probe=probe, seed=seed, **probe_kwargs)  # noqa: E731
    results: dict[str, dict[int, float]] = {}
    for name, label in (("rr", "RR"), ("jn", "JN")):
        if name in train:
            results[label] = {k: acc(train[name][:, :k], test[name][:, :k]).item() for k in dims}
    if fixed:
        results["FF"] = {k: acc(*fixed[k]).item() for k in dims if k in fixed}
    if "raw" in train and random_draws > 0:
        gen = torch.Generator().manual_seed(seed)
        d = train["raw"].shape[1]
        results["RS"] = {}
        for k in dims:
            subsets = torch.stack([torch.randperm(d, generator=gen)[:k] for _ in range(random_draws)])
            results["RS"][k] = acc(train["raw"][:, subsets].permute(1, 0, 2), test["raw"][:, subsets].permute(1, 0, 2)).mean().item()
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
    return {"dims": dims, "probe": probe, "accuracy": results, "ordering": ordering, "knn": knn}


def write_report(report: dict, out_dir: str | os.PathLike, title: str = "") -> dict[str, Path]:
    """Markdown + CSV table laid out like the paper's appendix tables, a JSON dump, and the PNG plot."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dims, acc = report["dims"], report["accuracy"]
    probe_note = "linear probe, SGD 50 epochs" if report["probe"] == "sgd" else "closed-form ridge probe (faster, not the paper's SGD probe)"
    lines = [f"### {title or 'Linear probe accuracy (%) by representation size'}", "", f"Probe: {probe_note}.", ""]
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
    paths = {"markdown": out / "table.md", "csv": out / "table.csv", "json": out / "report.json", "plot": out / "accuracy_vs_dim.png"}
    paths["markdown"].write_text("\n".join(lines) + "\n")
    with open(paths["csv"], "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", *dims])
        for method, row in acc.items():
            writer.writerow([method, *[f"{100 * row[k]:.2f}" if k in row else "" for k in dims]])
    paths["json"].write_text(json.dumps(report, indent=2, default=str) + "\n")
    _plot(report, paths["plot"], title)
    return paths


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


# -- eigtrain-eval ---------------------------------------------------------------------------------
USAGE = """eigtrain-eval: adaptive-dimension evaluation of a trained run or of stored features.

    eigtrain-eval run_dir=DIR [rr=DIR] [jn_run_dir=DIR] [ff_run_dirs=[DIR4,DIR8]] [probe=sgd|closed_form]
                  [random_draws=50] [dims=[4,8,16]] [train_split=train] [test_split=val] [out=DIR]
    eigtrain-eval features=FILE.npz rr=DIR out=DIR     # arrays train_z, train_y, test_z, test_y

RR uses the Rayleigh-Ritz export (default run_dir/rr, written by eigtrain-rr); JN is the run's own
coordinates when it was trained with joint nesting, or those of jn_run_dir; FF are runs trained at each
smaller dimension; RS are random subsets of the run's coordinates.
"""


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
    from .embed import embed_split, open_run
    from .export import load_head

    if bool(cfg.run_dir) == bool(cfg.features):
        raise ValueError("give exactly one of run_dir= or features=")
    if cfg.features:
        train_z, train_y, test_z, test_y = _load_features(cfg.features)
        nested, out = False, Path(cfg.out or Path(cfg.features).with_suffix(""))
    else:
        run = open_run(cfg.run_dir, device=cfg.device)
        (train_z, train_y), (test_z, test_y) = (embed_split(run, s, device=cfg.device) for s in (cfg.train_split, cfg.test_split))
        nested, out = run.cfg.nesting.mode != "none", Path(cfg.out or run.run_dir / "eval")
    train, test = {"raw": train_z}, {"raw": test_z}
    rr_dir = cfg.rr or (Path(cfg.run_dir) / "rr" if cfg.run_dir else None)
    if rr_dir and (Path(rr_dir) / "rr.safetensors").exists():
        head = load_head(rr_dir, dtype=torch.float64)
        train["rr"], test["rr"] = head(train_z.double()).float(), head(test_z.double()).float()
    elif cfg.rr:
        raise FileNotFoundError(f"no Rayleigh-Ritz export at {cfg.rr} (run eigtrain-rr first)")
    if nested:
        train["jn"], test["jn"] = train_z, test_z
    if cfg.jn_run_dir:
        jn = open_run(cfg.jn_run_dir, device=cfg.device)
        train["jn"], test["jn"] = (embed_split(jn, s, device=cfg.device)[0] for s in (cfg.train_split, cfg.test_split))
    fixed = {}
    for ff_dir in cfg.ff_run_dirs:
        ff = open_run(ff_dir, device=cfg.device)
        fixed[int(ff.cfg.dim)] = tuple(embed_split(ff, s, device=cfg.device)[0] for s in (cfg.train_split, cfg.test_split))
    dims = list(cfg.dims) if cfg.dims else dims_for(train_z.shape[1])
    report = adaptive_dimension_table(train, test, train_y, test_y, dims, fixed=fixed, random_draws=cfg.random_draws,
                                      probe=cfg.probe, seed=cfg.seed)
    title = f"Accuracy (%) by representation size — {Path(cfg.run_dir or cfg.features).name}"
    return report, write_report(report, out, title)


def main(argv: list[str] | None = None) -> int:
    import sys

    from .cli import parse_key_values

    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        cfg = parse_key_values(EvalConfig, args)
        report, paths = evaluate(cfg)
    except (ValueError, FileNotFoundError) as error:
        print(f"eigtrain-eval: {error}", file=sys.stderr)
        return 2
    print(paths["markdown"].read_text())
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    return 0
