"""Adaptive-dimension evaluation: what each dimension of an embedding is worth.

The table itself: eigtrain.evaluate.table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from eigtrain import safe_files
from eigtrain.dist import resolve_env, select_device
from eigtrain.evaluate import retrieval
from eigtrain.evaluate.eval_config import USAGE, EvalConfig  # noqa: F401  (checked before torch: eigtrain.commands)
from eigtrain.evaluate.label_free import UNLABELLED, label_free, label_free_table
from eigtrain.evaluate.probes import spectrum_report
from eigtrain.evaluate.report import write_report
from eigtrain.evaluate.table import adaptive_dimension_table
from eigtrain.runs.output_dirs import EVAL_ENTRIES, check_output_dir
from eigtrain.runs.provenance import export_provenance
from eigtrain.runs.run_step import weights_record
from eigtrain.train.knn import dims_for


def _load_features(path: str):
    """(train_z, train_y, test_z, test_y) from an .npz, checked before any work: 2-D real features of one width,
    one integer label per row, none below -1 (unlabelled); no train_y and test_y at all: every row unlabelled (-1).
    Labels are renumbered later (class_ids: only their equality counts, a label of 10**12 is one class)."""
    import numpy as np

    if not Path(path).is_file():
        raise FileNotFoundError(f"features file {path} does not exist")
    try:
        data = np.load(path, allow_pickle=False)  # numbers only: an object array is a pickle, never loaded
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError(f"{path} is one array, not an .npz archive of train_z, train_y, test_z, test_y")
        with data:
            unlabelled = "train_y" not in data and "test_y" not in data  # label-free features
            missing = [k for k in FEATURE_ARRAYS if k not in data and not (unlabelled and k.endswith("_y"))]
            if missing:
                raise ValueError(f"{path} lacks array(s) {missing}")
            arrays = {k: data[k] for k in FEATURE_ARRAYS if k in data}
    except (ValueError, OSError, EOFError) as error:
        raise ValueError(str(error) if str(path) in str(error) else f"cannot read {path}: {error}") from None
    for split in ("train", "test") if unlabelled else ():
        arrays[f"{split}_y"] = np.full(len(arrays[f"{split}_z"]), UNLABELLED)
    _check_features(path, arrays)
    z = lambda k: torch.from_numpy(arrays[k].astype(np.float32, copy=False))  # noqa: E731
    y = lambda k: torch.from_numpy(arrays[k].astype(np.int64))  # noqa: E731
    return z("train_z"), y("train_y"), z("test_z"), y("test_y")


FEATURE_ARRAYS = ("train_z", "train_y", "test_z", "test_y")


def class_ids(train_y: torch.Tensor, test_y: torch.Tensor, sources: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels as class ids 0..C-1 (only their equality counts: a label of 10**12 is one class); a negative label
    is refused in one line naming the split's data (-1, unlabelled, is label_free's: all or none)."""
    for split, y in (("train", train_y), ("test", test_y)):
        if len(y) and int(y.min()) < 0:
            raise ValueError(
                f"the {split} split ({safe_files.one_line(sources[split])}) holds {int((y < 0).sum())} of {len(y)} "
                f"samples with a negative label ({int(y.min())}): the probes score class labels (integers >= 0)"
            )
    ids = torch.unique(torch.cat([train_y, test_y]), return_inverse=True)[1]
    return ids[: len(train_y)], ids[len(train_y) :]


def _check_features(path: str, arrays: dict) -> None:
    """One line naming the file and the array for what the evaluation could not use."""
    import numpy as np

    for split in ("train", "test"):
        z, y = arrays[f"{split}_z"], arrays[f"{split}_y"]
        if z.ndim != 2 or not (np.issubdtype(z.dtype, np.floating) or np.issubdtype(z.dtype, np.integer)):
            raise ValueError(
                f"{path}: {split}_z must be a 2-D array of real numbers (rows x d), got {z.dtype} {z.shape}"
            )
        if not np.isfinite(z).all():
            raise ValueError(f"{path}: {split}_z holds NaN or infinite values")
        if y.ndim != 1 or len(y) != len(z):
            raise ValueError(
                f"{path}: {split}_y must hold one label per row of {split}_z ({len(z)}), got shape {y.shape}"
            )
        integral = np.issubdtype(y.dtype, np.integer) or (
            np.issubdtype(y.dtype, np.floating) and np.isfinite(y).all() and (y == np.round(y)).all()
        )
        if not integral or (len(y) and y.min() < UNLABELLED):
            raise ValueError(
                f"{path}: {split}_y must hold class indices (integers >= 0; -1: unlabelled), got {y.dtype} {y[:3]}..."
            )
    if arrays["train_z"].shape[1] != arrays["test_z"].shape[1]:
        raise ValueError(
            f"{path}: train_z and test_z have different widths {arrays['train_z'].shape[1]} and {arrays['test_z'].shape[1]}"
        )
    if len(arrays["train_z"]) < 2 or len(arrays["test_z"]) < 1:
        raise ValueError(
            f"{path}: too few rows to fit and score probes ({len(arrays['train_z'])} train, {len(arrays['test_z'])} test)"
        )


def evaluate(cfg) -> tuple[dict, dict]:
    cfg.validate()
    if cfg.out:  # before any work (write_report checks again): never write into a directory of someone else's
        check_output_dir(cfg.out, EVAL_ENTRIES, "out")
    device = str(select_device(resolve_env(), cfg.device))  # this task's GPU, bound as the trainer binds it
    inputs = _inputs(cfg, device)
    train, test, runs = inputs["train"], inputs["test"], inputs["runs"]
    reason = label_free(inputs["train_y"], inputs["test_y"], inputs["sources"])
    if reason:  # said first, in one line: the report that follows has no probe table
        print(f"eigtrain-eval: {reason}", file=sys.stderr, flush=True)
    rr_dir = cfg.rr or (Path(cfg.run_dir) / "rr" if cfg.run_dir else None)
    head, provenance = None, None
    if rr_dir and (Path(rr_dir) / "rr.safetensors").exists():
        head, provenance = _rr_features(cfg, Path(rr_dir), runs[0] if runs else None, train, test)
    elif cfg.rr:
        raise FileNotFoundError(f"no Rayleigh-Ritz export at {cfg.rr} (run eigtrain-rr first)")
    _more_features(cfg, inputs, device, labelled=not reason)
    dims = _dims(cfg.dims, train["raw"].shape[1])
    report = _table(cfg, inputs, dims, reason)
    report["data"] = inputs["sources"]  # which data each split came from (URLs without credentials)
    report["input"] = runs[0].output if runs else "features"  # embeddings as the objective saw them, or a file's
    report["weights"] = [weights_record(r) for r in runs]  # which step each run was scored at
    if "rr" in train and runs:
        report["rr_export"] = provenance  # whose weights the export was solved on (eigtrain.runs.provenance)
    if head is not None and rr_dir:
        report.update(_export_notes(head, Path(rr_dir), dims, report.get("smallest_k", {}).get("RR", {})))
    if cfg.retrieval_funnels:  # recall@10 vs cost of prefix searches, funnels and the exact bound-based early stop
        report["retrieval_funnels"] = _funnels(head, train, test, dims)
    return report, write_report(report, inputs["out"], Path(cfg.run_dir or cfg.features).name)


def _inputs(cfg, device: str) -> dict:
    """The scored embeddings ("train"/"test" {"raw": ...}), their labels as given, where each split came from, the
    opened runs (none for features=) and the report's directory."""
    if cfg.features:
        train_z, train_y, test_z, test_y = _load_features(cfg.features)
        sources = {"train": f"{cfg.features}: train_z", "test": f"{cfg.features}: test_z"}
        out, runs = Path(cfg.out or Path(cfg.features).with_suffix("")), []
    else:
        from eigtrain.export.embed import check_split, command_line_data, embed_split, open_run

        data = command_line_data(cfg.data)
        runs = [open_run(d, device=device, data=data) for d in (cfg.run_dir, cfg.jn_run_dir, *cfg.ff_run_dirs) if d]
        # every run's splits are checked before any is embedded: a refusal costs no work
        checked = [{"train": check_split(r, cfg.train_split), "test": check_split(r, cfg.test_split)} for r in runs]
        sources, out = checked[0], Path(cfg.out or runs[0].run_dir / "eval")
        (train_z, train_y), (test_z, test_y) = (
            embed_split(runs[0], s, device=device) for s in (cfg.train_split, cfg.test_split)
        )
    train, test = {"raw": train_z}, {"raw": test_z}
    return {"train": train, "test": test, "train_y": train_y, "test_y": test_y, "sources": sources, "runs": runs,
            "out": out}  # fmt: skip


def _more_features(cfg, inputs: dict, device: str, labelled: bool) -> None:
    """JN (the run's own coordinates when nested, or jn_run_dir's) into train/test; FF (ff_run_dirs, each k's model)
    into inputs["fixed"] when labelled (label-free recall compares each method with its own full size: FF has none)."""
    from eigtrain.export.embed import embed_split

    runs, train, test, splits = inputs["runs"], inputs["train"], inputs["test"], (cfg.train_split, cfg.test_split)
    if runs and runs[0].cfg.nesting.mode != "none":
        train["jn"], test["jn"] = train["raw"], test["raw"]
    if cfg.jn_run_dir:
        train["jn"], test["jn"] = (embed_split(runs[1], s, device=device)[0] for s in splits)
    ffs = runs[1 + bool(cfg.jn_run_dir) :] if labelled else []
    inputs["fixed"] = {int(ff.cfg.dim): tuple(embed_split(ff, s, device=device)[0] for s in splits) for ff in ffs}


def _table(cfg, inputs: dict, dims: list[int], reason: str | None) -> dict:
    """The probe table (eigtrain.evaluate.table), or without labels the label-free one (eigtrain.evaluate.label_free)."""
    backend = None if cfg.retrieval == "none" else retrieval.resolve_backend(cfg.retrieval)
    train, test = inputs["train"], inputs["test"]
    if reason:
        args = dict(pca=cfg.pca, retrieval_backend=backend, retrieval_draws=cfg.retrieval_draws, seed=cfg.seed)
        return label_free_table(train, test, dims, reason, **args)
    train_y, test_y = class_ids(inputs["train_y"], inputs["test_y"], inputs["sources"])
    return adaptive_dimension_table(
        train,
        test,
        train_y,
        test_y,
        dims,
        fixed=inputs["fixed"],
        random_draws=cfg.random_draws,
        random_se=cfg.random_se,
        probe=cfg.probe,
        seed=cfg.seed,
        pca=cfg.pca,
        retrieval_backend=backend,
        retrieval_draws=cfg.retrieval_draws,
    )


def _dims(given: list[int] | None, d: int) -> list[int]:
    """The sizes scored, checked before any probe (a size the embedding does not have would be scored as d)."""
    dims = list(given) if given else dims_for(d)
    wrong = [k for k in dims if not 0 < k <= d]
    if wrong:
        raise ValueError(f"dims={dims}: {wrong[0]} is not a size of these {d}-dimensional features")
    return dims


def _export_notes(head, rr_dir: Path, dims: list[int], measured: dict) -> dict:
    """What the export says beside the table: the k its spectrum suggests (against the k the probes measured), which
    cuts the data determine, and its ties rule."""
    from eigtrain.export.files import MANIFEST

    manifest = json.loads((rr_dir / MANIFEST).read_text())
    return {
        "eigenvalues": head.eigenvalues.tolist(),  # in feature order (the trivial mode excluded, when it is)
        "spectrum": spectrum_report(head.eigenvalues, dims, measured),
        "rr_cuts": manifest.get("cuts"),  # None: an export from before, folds=0, or too few samples
        "rr_ties": manifest.get("ties"),  # ties=variance: the groups reordered by variance
    }


def _funnels(head, train: dict, test: dict, dims: list[int]) -> dict:
    if head is None:
        raise ValueError("retrieval_funnels=true needs a Rayleigh-Ritz export (rr=DIR, or the run's rr/)")
    from eigtrain.evaluate.funnels import funnel_report

    return funnel_report(train["rr"].numpy(), test["rr"].numpy(), head.eigenvalues.numpy(), dims)


def _rr_features(cfg, rr_dir: Path, run, train: dict, test: dict):
    """The Rayleigh-Ritz export's ordered features of both splits into train/test ("rr", and "rr_paper" when the
    export holds the paper's convention too), after checking the export fits this run: its head and provenance."""
    from safetensors import safe_open

    from eigtrain.export.files import load_head

    provenance = None
    head = load_head(rr_dir, dtype=torch.float64)
    if head.transform.shape[0] != train["raw"].shape[1]:  # e.g. rr= another model's export: say so, not torch's shapes
        raise ValueError(
            f"the Rayleigh-Ritz export {rr_dir} was fitted on {head.transform.shape[0]}-dimensional "
            f"embeddings; this run's encoder gives {train['raw'].shape[1]} (rr= must be this run's export)"
        )
    if run is not None and head.l2_normalize != (run.output == "l2_normalized"):  # e.g. an export made before
        raise ValueError(  # Rayleigh-Ritz worked on what the objective saw: its features would be wrong
            f"the Rayleigh-Ritz export {rr_dir} was solved on {'l2-normalized' if head.l2_normalize else 'raw'} "
            f"embeddings, but this run's objective sees {run.output.replace('_', '-')} ones: run eigtrain-rr "
            f"again (overwrite=true)"
        )
    if run is not None:  # the export must be of the weights scored here (eigtrain.runs.provenance)
        provenance = export_provenance(Path(rr_dir), run.weights, run.weights_sha256, cfg.allow_foreign_export)
    train["rr"], test["rr"] = head(train["raw"].double()).float(), head(test["raw"].double()).float()
    if "paper_eigenvalues" in safe_open(str(Path(rr_dir) / "rr.safetensors"), "pt").keys():  # both conventions
        paper = load_head(rr_dir, dtype=torch.float64, convention="paper")
        train["rr_paper"], test["rr_paper"] = paper(train["raw"].double()).float(), paper(test["raw"].double()).float()
    return head, provenance


def main(argv: list[str] | None = None) -> int:
    from eigtrain.cli import asks_for_help, compose_dataclass, one_line_errors

    args = sys.argv[1:] if argv is None else argv
    if asks_for_help(args, USAGE):
        return 0

    def body() -> None:
        report, paths = evaluate(compose_dataclass(EvalConfig, args))
        print(paths["markdown"].read_text())
        print("\n".join(f"{name}: {path}" for name, path in paths.items()))

    return one_line_errors("eigtrain-eval", body)
