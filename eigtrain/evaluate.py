"""Adaptive-dimension evaluation: what each dimension of an embedding is worth.

At each dimension k in {4, 8, ..., d}, a linear probe on frozen features for:
  RR  the first k Rayleigh-Ritz ordered features of the full embedding,
  JN  the first k coordinates of a joint-nesting encoder,
  FF  separately trained k-dimensional encoders (when given),
  RS  k random coordinates of the full embedding, averaged over many draws (trained in parallel),
  PCA the first k principal components of the same full embedding (the unsupervised baseline),
plus the paired differences against PCA (on the same test samples, with bootstrap intervals: `PAIRED`), an
ordering check (RR top-k vs bottom-k) and kNN accuracy. At every k also: retrieval (1-NN accuracy
against the training split, recall@{1,10} within the validation split; eigtrain.retrieval), bytes per
vector (fp32/fp16/int8), measured exact-search time per query, and the smallest k within 1 and 5 points of
each method's accuracy at full dimension.

Probe: the paper's protocol is a linear classifier trained 50 epochs with SGD (lr 0.1, momentum 0.9,
weight decay 1e-4, cosine schedule) on frozen features, here whitened on the training split (`probes.whiten`), so
methods differ only where their subspaces do; kNN, like retrieval, uses each method's own coordinates.
`probe="closed_form"` is a faster ridge least-squares classifier on one-hot targets; it is stated as such in every
table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

from . import retrieval
from .dist import resolve_env, select_device
from .eval_report import PREFIX_METHODS, RR_PAPER, write_report
from .output_dirs import EVAL_ENTRIES, check_output_dir
from .probes import (
    constant_shares,
    dims_for,
    knn_accuracy,
    paired_difference,
    pca_features,
    probe_correct,
    smallest_k_within,
    spectrum_report,
)
from .provenance import export_provenance
from .redact import redact_url
from .run_step import weights_record

PAIRED = (("RR", "PCA"), (RR_PAPER, "PCA"), ("JN", "PCA"), ("FF", "PCA"), ("RR", RR_PAPER))  # the differences reported


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
    hits = lambda tr, te: probe_correct(tr, train_y, te, test_y, probe=probe, seed=seed, **probe_kwargs)  # noqa: E731
    acc = lambda tr, te: hits(tr, te).mean(-1)  # noqa: E731
    results: dict[str, dict[int, float]] = {}
    correct: dict[str, dict[int, torch.Tensor]] = {}  # per method and k: which test samples its probe got right
    prefixes = {label: name for name, label in PREFIX_METHODS if name in train}

    def score(label: str, pairs: Mapping[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        correct[label] = {k: hits(*pair)[0] for k, pair in pairs.items()}
        results[label] = {k: c.mean().item() for k, c in correct[label].items()}

    for label in ("RR", RR_PAPER, "JN", "FF", "PCA"):  # table order: RR, RR (paper), JN, FF, PCA, RS
        if label == "FF" and fixed:
            score("FF", {k: fixed[k] for k in dims if k in fixed})
        elif label in prefixes:
            name = prefixes[label]
            score(label, {k: (train[name][:, :k], test[name][:, :k]) for k in dims})
    subsets = {}
    if "raw" in train and random_draws > 0:
        gen = torch.Generator().manual_seed(seed)
        d = train["raw"].shape[1]
        results["RS"] = {}
        for k in dims:
            subsets[k] = torch.stack([torch.randperm(d, generator=gen)[:k] for _ in range(random_draws)])
            results["RS"][k] = (
                acc(train["raw"][:, subsets[k]].permute(1, 0, 2), test["raw"][:, subsets[k]].permute(1, 0, 2))
                .mean()
                .item()
            )
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
    report = {
        "dims": dims,
        "probe": probe,
        # each method's first k on the training split's covariance (probes.whiten), unless a caller asks otherwise
        "probe_features": "whitened" if probe_kwargs.get("whitened", True) else "standardized",
        "accuracy": results,
        "ordering": ordering,
        "knn": knn,
        "constant_share": constant_shares(test, prefixes, fixed),
        "paired": {  # accuracy differences on the same test samples, with their bootstrap intervals
            f"{a} vs {b}": {
                k: paired_difference(correct[a][k], correct[b][k], seed=seed) for k in correct[a] if k in correct[b]
            }
            for a, b in PAIRED
            if a in correct and b in correct
        },
    }
    if retrieval_backend is not None:
        report.update(
            retrieval.retrieval_report(
                train,
                test,
                train_y,
                test_y,
                dims,
                prefixes,
                fixed,
                subsets,
                retrieval_draws,
                retrieval.resolve_backend(retrieval_backend),
            )
        )
    one_nn = {m: {k: v["1nn"] for k, v in r.items()} for m, r in report.get("retrieval", {}).items()}
    report["smallest_k"] = {
        m: {**_within(results.get(m), "accuracy"), **_within(one_nn.get(m), "1nn")} for m in results
    }
    return report


def _within(row: Mapping[int, float] | None, metric: str) -> dict[str, int | None]:
    return {f"{metric}_within_{x}pt": smallest_k_within(row, x) for x in (1, 5)} if row else {}


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

    shards: Any = None  # replaces the run's data.shards (pattern or list)
    val_shards: Any = None  # replaces the run's data.val_shards: the held-out shards scored as split val
    shard_index: str | None = None  # a wids index of the shards' sample counts
    allow_pipe: bool = False  # run pipe: sources read back from a run's saved config.yaml


@dataclass
class EvalConfig:
    run_dir: str | None = None  # the run evaluated (its newest verified weights, its data)
    features: str | None = None  # instead of a run: an .npz of train_z, train_y, test_z, test_y
    rr: str | None = None  # the Rayleigh-Ritz export (null: run_dir/rr, written by eigtrain-rr)
    jn_run_dir: str | None = None  # a joint-nesting run whose coordinates are JN (null: the run's own, if nested)
    ff_run_dirs: list[str] = field(default_factory=list)  # runs trained at each smaller dimension (FF)
    train_split: str = "train"  # the split the probes train on
    test_split: str = "val"  # the split scored
    probe: str = "sgd"  # sgd (the paper's protocol, on whitened features) | closed_form (ridge least squares)
    random_draws: int = 50  # random coordinate subsets averaged for RS at each dimension
    dims: list[int] | None = None  # the dimensions scored (null: 4, 8, ..., d)
    out: str | None = None  # where the report goes (null: run_dir/eval, or the features file without .npz)
    device: str = "cpu"  # auto | cpu | cuda
    seed: int = 0  # the probes' and the random subsets' seed
    pca: bool = True  # score PCA of the same embedding (the unsupervised baseline)
    retrieval: str = "auto"  # auto (FAISS when installed, else torch) | torch | faiss | none
    retrieval_draws: int = 5  # random subsets averaged for RS retrieval
    allow_foreign_export: bool = False  # score through an export solved on other weights (stated in the report)
    data: EvalDataConfig = field(default_factory=EvalDataConfig)  # data sources replacing the run's saved ones


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
    from safetensors import safe_open

    from .embed import check_split, command_line_data, embed_split, open_run
    from .export import MANIFEST, load_head

    if bool(cfg.run_dir) == bool(cfg.features):
        raise ValueError("give exactly one of run_dir= or features=")
    if cfg.run_dir and cfg.train_split == cfg.test_split:  # a training accuracy is not the held-out score asked for
        raise ValueError(
            f"train_split and test_split are both {cfg.test_split!r}: the probes would be scored on the samples they "
            f"were fitted on; choose another test_split (a run on data.shards: split 'val' with data.val_shards)"
        )
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
        jn, ffs = (runs[1] if cfg.jn_run_dir else None), runs[1 + bool(cfg.jn_run_dir) :]
        (train_z, train_y), (test_z, test_y) = (
            embed_split(run, s, device=device) for s in (cfg.train_split, cfg.test_split)
        )
        nested, out = run.cfg.nesting.mode != "none", Path(cfg.out or run.run_dir / "eval")
    train, test = {"raw": train_z}, {"raw": test_z}
    rr_dir = cfg.rr or (Path(cfg.run_dir) / "rr" if cfg.run_dir else None)
    if rr_dir and (Path(rr_dir) / "rr.safetensors").exists():
        head = load_head(rr_dir, dtype=torch.float64)
        if head.transform.shape[0] != train_z.shape[1]:  # e.g. rr= another model's export: say so, not torch's shapes
            raise ValueError(
                f"the Rayleigh-Ritz export {rr_dir} was fitted on {head.transform.shape[0]}-dimensional "
                f"embeddings; this run's encoder gives {train_z.shape[1]} (rr= must be this run's export)"
            )
        if cfg.run_dir and head.l2_normalize != (run.output == "l2_normalized"):  # e.g. an export made before
            raise ValueError(  # Rayleigh-Ritz worked on what the objective saw: its features would be wrong
                f"the Rayleigh-Ritz export {rr_dir} was solved on {'l2-normalized' if head.l2_normalize else 'raw'} "
                f"embeddings, but this run's objective sees {run.output.replace('_', '-')} ones: run eigtrain-rr "
                f"again (overwrite=true)"
            )
        if cfg.run_dir:  # the export must be of the weights scored here (eigtrain.provenance)
            provenance = export_provenance(Path(rr_dir), run.weights, run.weights_sha256, cfg.allow_foreign_export)
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
    report = adaptive_dimension_table(
        train,
        test,
        train_y,
        test_y,
        dims,
        fixed=fixed,
        random_draws=cfg.random_draws,
        probe=cfg.probe,
        seed=cfg.seed,
        pca=cfg.pca,
        retrieval_backend=backend,
        retrieval_draws=cfg.retrieval_draws,
    )
    report["data"] = sources  # which data each split came from (URLs without credentials)
    report["input"] = run.output if cfg.run_dir else "features"  # embeddings as the objective saw them, or a file's
    report["weights"] = [weights_record(r) for r in runs] if cfg.run_dir else []  # which step each run was scored at
    if "rr" in train and cfg.run_dir:
        report["rr_export"] = provenance  # whose weights the export was solved on (eigtrain.provenance)
    if "rr" in train:  # the k the export's spectrum suggests, beside the k the probes measured
        report["spectrum"] = spectrum_report(head.eigenvalues, dims, report["smallest_k"].get("RR", {}))
        manifest = json.loads((Path(rr_dir) / MANIFEST).read_text())
        report["rr_cuts"] = manifest.get("cuts")  # None: an export from before, folds=0, or too few samples
        report["rr_ties"] = manifest.get("ties")  # ties=variance: the groups reordered by variance
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
