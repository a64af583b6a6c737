"""The adaptive-dimension table (eigtrain-eval): what each dimension of an embedding is worth.

At each dimension k in {4, 8, ..., d}, a linear probe on frozen features for:
  RR  the first k Rayleigh-Ritz ordered features of the full embedding,
  JN  the first k coordinates of a joint-nesting encoder,
  FF  separately trained k-dimensional encoders (when given),
  RS  k random coordinates of the full embedding, averaged over many draws (trained in parallel),
  PCA the first k principal components of the same full embedding (the unsupervised baseline),
plus the paired differences against PCA (on the same test samples, with bootstrap intervals: `PAIRED`), an
ordering check (RR top-k vs bottom-k) and kNN accuracy. At every k also: retrieval (1-NN accuracy
against the training split, hit@{1,10} within the validation split: a same-class item among the k nearest;
eigtrain.evaluate.retrieval), bytes per vector (fp32/fp16/int8), measured exact-search time per query, and the
smallest k within 1 and 5 points of each method's accuracy at full dimension.

Probe: the paper's protocol is a linear classifier trained 50 epochs with SGD (lr 0.1, momentum 0.9,
weight decay 1e-4, cosine schedule) on frozen features, here whitened on the training split (`probes.whiten`), so
methods differ only where their subspaces do; kNN, like retrieval, uses each method's own coordinates.
`probe="closed_form"` is a faster ridge least-squares classifier on one-hot targets; it is stated as such in every
table.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from eigtrain.evaluate import retrieval
from eigtrain.evaluate.probes import constant_shares, paired_difference, pca_features, probe_correct, smallest_k_within
from eigtrain.evaluate.progress import StepProgress
from eigtrain.evaluate.report import PREFIX_METHODS, RR_PAPER
from eigtrain.train.knn import knn_accuracy

PAIRED = (("RR", "PCA"), (RR_PAPER, "PCA"), ("JN", "PCA"), ("FF", "PCA"), ("RR", RR_PAPER))  # the differences reported


def adaptive_dimension_table(
    train: Mapping[str, torch.Tensor],
    test: Mapping[str, torch.Tensor],
    train_y: torch.Tensor,
    test_y: torch.Tensor,
    dims: list[int],
    fixed: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    random_draws: int = 50,
    random_se: float = 0.1,
    probe: str = "sgd",
    seed: int = 0,
    pca: bool = True,
    retrieval_backend: str | None = "auto",
    retrieval_draws: int = 5,
    **probe_kwargs,
) -> dict:
    """Accuracy per method and dimension. train/test hold "rr" (Rayleigh-Ritz ordered features), optionally "jn"
    (a joint-nesting encoder's features) and "raw" (the unordered full features, for random selection and the PCA
    baseline). fixed maps k to the (train, test) features of a separately trained k-dimensional encoder.
    retrieval_backend=None skips retrieval and timing. RS: up to `random_draws` subsets per k, until the mean's
    standard error is at most `random_se` points (`_draws_until`); RS retrieval: the first `retrieval_draws`."""
    train, test = dict(train), dict(test)
    if pca and "raw" in train:
        train["pca"], test["pca"] = pca_features(train["raw"], test["raw"])
    prefixes = {label: name for name, label in PREFIX_METHODS if name in train}
    rs = "raw" in train and random_draws > 0
    steps = (len(prefixes) + bool(fixed) + rs + ("rr" in train)) * len(dims) + 2  # probes, the ordering, kNN, retrieval
    progress = StepProgress(steps)
    hits = lambda tr, te: probe_correct(tr, train_y, te, test_y, probe=probe, seed=seed, **probe_kwargs)  # noqa: E731
    acc = lambda tr, te: hits(tr, te).mean(-1)  # noqa: E731
    results: dict[str, dict[int, float]] = {}
    correct: dict[str, dict[int, torch.Tensor]] = {}  # per method and k: which test samples its probe got right

    def score(label: str, pairs: Mapping[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        correct[label] = {}
        for k, pair in pairs.items():
            progress.step(f"{label} probe at k={k}")
            correct[label][k] = hits(*pair)[0]
        results[label] = {k: c.mean().item() for k, c in correct[label].items()}

    for label in ("RR", RR_PAPER, "JN", "FF", "PCA"):  # table order: RR, RR (paper), JN, FF, PCA, RS
        if label == "FF" and fixed:
            score("FF", {k: fixed[k] for k in dims if k in fixed})
        elif label in prefixes:
            name = prefixes[label]
            score(label, {k: (train[name][:, :k], test[name][:, :k]) for k in dims})
    subsets = random_subsets(train["raw"].shape[1], dims, random_draws, seed) if rs else {}
    subsets_used: dict = {}  # how many subsets RS averaged at each k, and the standard error of that mean (points)
    if subsets:
        results["RS"], subsets_used = _subset_results(train["raw"], test["raw"], subsets, acc, progress, random_se)
    ordering = _ordering(train, test, results, dims, acc, progress) if "rr" in train else {}
    progress.step("kNN at full dimension")
    report: dict[str, Any] = {
        "dims": dims,
        "probe": probe,
        # each method's first k on the training split's covariance (probes.whiten), unless a caller asks otherwise
        "probe_features": "whitened" if probe_kwargs.get("whitened", True) else "standardized",
        "accuracy": results,
        "ordering": ordering,
        "knn": {name: knn_accuracy(train[name], train_y, test[name], test_y) for name in train},
        "constant_share": constant_shares(test, prefixes, fixed),
        "paired": _paired(correct, seed),
        **({"random_subsets": subsets_used} if subsets_used else {}),
    }
    if retrieval_backend is not None:
        progress.step("retrieval at every k")
        backend = retrieval.resolve_backend(retrieval_backend)
        args = (train, test, train_y, test_y, dims, prefixes, fixed, subsets, retrieval_draws, backend)
        report.update(retrieval.retrieval_report(*args))
    return _with_smallest_k(report, results)


def _with_smallest_k(report: dict, results: Mapping[str, Mapping[int, float]]) -> dict:
    """The smallest k within 1 and 5 points of each method's full-dimension accuracy and 1-NN accuracy."""
    one_nn = {m: {k: v["1nn"] for k, v in r.items()} for m, r in report.get("retrieval", {}).items()}
    report["smallest_k"] = {
        m: {**_within(results.get(m), "accuracy"), **_within(one_nn.get(m), "1nn")} for m in results
    }
    return report


def _within(row: Mapping[int, float] | None, metric: str) -> dict[str, int | None]:
    return {f"{metric}_within_{x}pt": smallest_k_within(row, x) for x in (1, 5)} if row else {}


def _subset_results(train_raw, test_raw, subsets: Mapping[int, torch.Tensor], acc, progress, se: float):
    """RS: at each k, the mean accuracy of the probes on its random coordinate subsets, and per k the draws used
    and the standard error of their mean (points)."""
    results, used = {}, {}
    for k, draws in subsets.items():
        progress.step(f"RS probes at k={k} (up to {len(draws)} random subsets)")
        scores = _draws_until(train_raw, test_raw, draws, acc, se / 100)
        results[k] = scores.mean().item()
        used[k] = {"draws": len(scores), "stderr": 100 * _stderr(scores)}
    return results, used


def _stderr(scores: torch.Tensor) -> float:
    return (scores.double().std() / len(scores) ** 0.5).item() if len(scores) > 1 else 0.0


def _draws_until(train_raw, test_raw, draws: torch.Tensor, acc, se: float, group: int = 5) -> torch.Tensor:
    """The accuracies of the first draws, `group` at a time, until the standard error of their mean is at most
    `se` (a fraction) or every draw is scored (se <= 0: every draw). Wide subsets overlap most of the coordinates
    and their probes barely differ, so most of their draws (the costly probes) would move the mean by less than its
    error; narrow ones differ and are cheap, and get their draws."""
    if se <= 0:
        return _subset_accuracy(train_raw, test_raw, draws, acc)
    scores = _subset_accuracy(train_raw, test_raw, draws[:group], acc)
    while len(scores) < len(draws) and _stderr(scores) > se:
        scores = torch.cat(
            [scores, _subset_accuracy(train_raw, test_raw, draws[len(scores) : len(scores) + group], acc)]
        )
    return scores


def _subset_accuracy(train_raw, test_raw, draws: torch.Tensor, acc, budget_bytes: int = 1 << 28) -> torch.Tensor:
    """Each draw's probe accuracy (coordinate subsets `draws`, (R, k)). The R probes train in parallel, in groups
    whose stacked features stay within `budget_bytes` (a probe copies its input a few times: at 60,000 x 512 all
    50 draws at once would be 6 GB per copy). A group's probes are the same as they would be all together: each
    is fitted on its own subset, and every group replays the same seeded batch order."""
    per_draw = 4 * (len(train_raw) + len(test_raw)) * draws.shape[1]
    group = max(1, budget_bytes // max(per_draw, 1))
    return torch.cat(
        [acc(*(x[:, chunk].permute(1, 0, 2) for x in (train_raw, test_raw))) for chunk in draws.split(group)]
    )


def random_subsets(d: int, dims: list[int], draws: int, seed: int) -> dict[int, torch.Tensor]:
    """RS: `draws` random coordinate subsets of each size k (one generator, so the same subsets for every probe).
    At k >= d there is one: every subset is all d coordinates in some order, and the whitened probe, kNN and the
    cosine search are the same in any order of the coordinates."""
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.stack([torch.randperm(d, generator=gen)[:k] for _ in range(draws if k < d else 1)]) for k in dims}


def _ordering(train, test, results, dims: list[int], acc, progress) -> dict[int, dict[str, float]]:
    """RR's top k against its bottom k: ordered features put the useful ones first."""
    d, rows = train["rr"].shape[1], {}
    for k in (k for k in dims if k < d):
        progress.step(f"the ordering check at k={k} (RR's bottom {k} features)")
        rows[k] = {"top": results["RR"][k], "bottom": acc(train["rr"][:, d - k :], test["rr"][:, d - k :]).item()}
    return rows


def _paired(correct: Mapping[str, Mapping[int, torch.Tensor]], seed: int) -> dict:
    """Accuracy differences on the same test samples (`PAIRED`), with their bootstrap intervals."""
    return {
        f"{a} vs {b}": {
            k: paired_difference(correct[a][k], correct[b][k], seed=seed) for k in correct[a] if k in correct[b]
        }
        for a, b in PAIRED
        if a in correct and b in correct
    }
