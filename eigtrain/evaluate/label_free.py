"""Label-free evaluation: eigtrain-eval on unlabelled data (the usual self-supervised case), what needs no labels.

With no labels a probe has nothing to fit and retrieval no class to hit, so the report keeps, at every size k:
- neighbour recall@10: the share of each validation query's exact top-10 among the training vectors (cosine, at the
  method's full size) that a cosine search on its first k features returns; the funnels' measure
  (eigtrain.evaluate.funnels: the share of an exact top-10 found), not hit@10 (a same-class item in the top 10);
- bytes per vector and the measured search time, how constant each feature is, and the export's spectrum.
Unlabelled means label -1 (shards read without data.label_key) or no labels at all (features= without train_y and
test_y). A mixture of labelled and unlabelled samples is refused (`label_free`): the probes would silently drop or
mis-score the unlabelled ones, and label-free results would ignore labels the user has.
"""

from __future__ import annotations

from typing import Mapping

import torch

from eigtrain import safe_files
from eigtrain.evaluate import retrieval
from eigtrain.evaluate.funnels import recall_at
from eigtrain.evaluate.probes import constant_shares, pca_features
from eigtrain.evaluate.report import PREFIX_METHODS
from eigtrain.evaluate.table import random_subsets

UNLABELLED = -1  # the label eigtrain's decoder gives a sample when the data name no label (data.label_key unset)
TOP = 10


def label_free(train_y: torch.Tensor, test_y: torch.Tensor, sources: Mapping[str, str]) -> str | None:
    """None when no sample is unlabelled (the probes run); the line saying why the evaluation is label-free when
    every sample is; a mixture is refused in one line naming both splits' data."""
    ys = {"train": train_y, "test": test_y}
    missing = {split: int((y == UNLABELLED).sum()) for split, y in ys.items()}
    where = {split: safe_files.one_line(sources[split]) for split in ys}
    if not any(missing.values()):
        return None
    if all(missing[split] == len(y) for split, y in ys.items()):
        return (
            f"label-free evaluation: no sample of the train split ({where['train']}) or the test split "
            f"({where['test']}) has a label (-1 throughout: no data.label_key, or no train_y/test_y), so no probes "
            f"and no class-based retrieval; reported instead: neighbour recall@10 of each cut against exact search at "
            f"full size, storage, search time and the spectrum"
        )
    counts = ", ".join(f"{missing[s]} of {len(ys[s])} in the {s} split ({where[s]})" for s in ys)
    raise ValueError(
        f"labels are mixed: {counts} are unlabelled (label -1); the probes need every sample labelled and "
        f"label-free evaluation none: give data whose samples all carry data.label_key, or none do"
    )


def overlap(found: torch.Tensor, reference: torch.Tensor) -> float:
    """The share of each row of `reference` (queries x top) found in the same row of `found` (funnels.recall_at)."""
    return recall_at(found.numpy(), reference.numpy(), reference.shape[1])


def neighbour_recall(
    database: torch.Tensor, queries: torch.Tensor, dims: list[int], backend: str, columns=None
) -> dict[int, float]:
    """recall@10 at each k: cosine top-10 on the first k features (or, with `columns`, on the coordinate subsets
    columns[k], averaged) against the exact cosine top-10 on all of them."""
    reference = retrieval.search(database, queries, TOP, backend)
    if columns is None:
        return {k: overlap(retrieval.search(database[:, :k], queries[:, :k], TOP, backend), reference) for k in dims}
    found = lambda s: retrieval.search(database[:, s], queries[:, s], TOP, backend)  # noqa: E731
    return {k: sum(overlap(found(s), reference) for s in columns[k]) / len(columns[k]) for k in dims}


def label_free_table(
    train: Mapping[str, torch.Tensor],
    test: Mapping[str, torch.Tensor],
    dims: list[int],
    reason: str,
    pca: bool = True,
    retrieval_backend: str | None = "torch",
    retrieval_draws: int = 5,
    seed: int = 0,
) -> dict:
    """The label-free report: neighbour recall@10 per method (RR, RR (paper), JN, PCA: their first k features; RS:
    `retrieval_draws` random subsets of the raw embedding, against the raw embedding), storage and search time per
    k, constant shares. retrieval_backend=None (retrieval=none) leaves the constant shares only."""
    train, test = dict(train), dict(test)
    if pca and "raw" in train:
        train["pca"], test["pca"] = pca_features(train["raw"], test["raw"])
    prefixes = {label: name for name, label in PREFIX_METHODS if name in train}
    report: dict = {"label_free": reason, "dims": dims, "constant_share": constant_shares(test, prefixes, None)}
    if retrieval_backend is None:
        return report
    backend = retrieval.resolve_backend(retrieval_backend)
    rows = {label: neighbour_recall(train[name], test[name], dims, backend) for label, name in prefixes.items()}
    if retrieval_draws > 0:
        subsets = random_subsets(train["raw"].shape[1], dims, retrieval_draws, seed)
        rows["RS"] = neighbour_recall(train["raw"], test["raw"], dims, backend, columns=subsets)
    timed = next(iter(prefixes.values()), "raw")  # search time depends on k and the sizes, not on the method
    report["neighbour_recall"] = rows
    report["storage"] = retrieval.storage(train[timed], test[timed], dims, backend)
    report["neighbour_recall_setup"] = {
        "backend": backend,
        "database": len(train["raw"]),
        "queries": len(test["raw"]),
        "rs_draws": retrieval_draws,
        "reference": "each method's exact cosine top-10 at its full size (RS: the raw embedding's)",
    }
    return report
