"""What k features are worth to a classifier: linear probes (SGD or closed form) on frozen features, PCA of an
embedding, weighted kNN, the smallest k within X points, each feature's constant share and the k the spectrum
suggests. Pure tensor code: eigtrain-eval (`eigtrain.evaluate.command`) and the online monitor call it."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch

from eigtrain.dist import torch_threads
from eigtrain.export.prefixes import spectral_k_report

F32 = torch.float32


def whiten(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both splits in the training split's whitened coordinates (float32, shapes kept): centred on the training
    mean and mapped by V Λ^(-1/2) from the eigendecomposition of the training covariance (float64, in row
    blocks), so a linear map applied to the input changes them only by a rotation. Its numerical range only:
    a direction whose standard deviation is under k·ε (ε the input's machine epsilon) of the largest is the
    input's rounding, not its signal, and becomes a zero column (a rank-deficient prefix never blows up).
    (n, k) or a stack (R, n, k) of independent problems, each whitened by its own covariance."""
    n, k = train.shape[-2:]
    eps = torch.finfo(train.dtype if train.is_floating_point() else F32).eps
    rows = max(1, (1 << 24) // max(train[..., :1, :].numel(), 1))  # float64 blocks of at most 128 MiB
    blocks = lambda x: _row_blocks(x, rows, axis=-2)  # noqa: E731
    mean = sum(b.sum(-2, keepdim=True) for b in blocks(train)) / n
    cov = sum((b - mean).mT @ (b - mean) for b in blocks(train)) / max(n - 1, 1)
    variances, directions = torch.linalg.eigh(cov)  # ascending
    keep = variances > variances[..., -1:].clamp_min(0) * (k * eps) ** 2
    scale = torch.where(keep, variances.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), 0.0)
    project = directions * scale[..., None, :]
    mapped = lambda x: torch.cat([((b - mean) @ project).float() for b in blocks(x)], -2)  # noqa: E731
    return mapped(train), mapped(test)


def _standardize(train: torch.Tensor, test: torch.Tensor):
    """Each feature to mean 0, variance 1 on the training split (what the probes did before `whiten`: correlated
    features stay ill-conditioned, so the same space scored by its basis)."""
    train, test = train.to(F32), test.to(F32)
    mean, std = train.mean(-2, keepdim=True), train.std(-2, keepdim=True).clamp_min(1e-8)
    return (train - mean) / std, (test - mean) / std


def probe_accuracy(
    train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor, **options
) -> torch.Tensor:
    """Test accuracy of linear probes: `probe_correct` (whose keyword options it takes) averaged over the test
    samples; a tensor of R accuracies."""
    return probe_correct(train_x, train_y, test_x, test_y, **options).mean(-1)


def probe_correct(
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
    whitened: bool = True,
) -> torch.Tensor:
    """Which test samples linear probes classify right (1) or wrong (0). Inputs (n, k) or a stack of R
    independent problems (R, n, k); returns (R, n_test) (R = 1 for 2-D input). The R probes train in parallel.
    The probes see their input `whiten`ed on the training split, so they score its span, not its basis: an
    invertible linear map of the input only rotates what they see, and both probes (ridge on all weights; SGD
    from zero weights with L2 decay) are equivariant under rotations. whitened=False: per-feature
    standardization (the former protocol, basis-dependent; kept to show the difference)."""
    if probe not in ("sgd", "closed_form"):
        raise ValueError(f"probe={probe!r} is unknown; allowed: sgd, closed_form")
    squeeze = train_x.ndim == 2
    if squeeze:
        train_x, test_x = train_x[None], test_x[None]
    train_x, test_x = (whiten if whitened else _standardize)(train_x, test_x)
    classes = int(max(train_y.max(), test_y.max())) + 1
    reps, n, k = train_x.shape
    xb = torch.cat([train_x, torch.ones(reps, n, 1)], -1)  # bias column
    onehot = torch.nn.functional.one_hot(train_y.long(), classes).to(F32)

    if probe == "closed_form":
        gram = xb.transpose(1, 2) @ xb + ridge * n * torch.eye(k + 1)
        w = torch.linalg.solve(gram, xb.transpose(1, 2) @ onehot.expand(reps, n, classes))
    else:  # softmax regression; the gradient is written out (no autograd) to keep the probe cheap
        with _threads_for(reps * min(batch_size, n) * (k + 1) * classes):
            w = _sgd_probe(xb, onehot, epochs, lr, momentum, weight_decay, batch_size, seed)
    test_b = torch.cat([test_x, torch.ones(reps, len(test_y), 1)], -1)
    return ((test_b @ w).argmax(-1) == test_y.long()).to(F32)


def _threads_for(step_elements: int, small: int = 1 << 22):
    """One thread for a probe whose steps are small products: 50 epochs at 60,000 samples are 11,750 steps of a
    few microseconds each, and waking a second thread for each costs more than it saves (measured on 2 cores under
    load: 2 epochs of a 4-feature probe 10.8 s with two threads, 0.54 s with one). Large steps keep every thread."""
    return torch_threads(1 if step_elements < small else None)


def _sgd_probe(xb, onehot, epochs, lr, momentum, weight_decay, batch_size, seed) -> torch.Tensor:
    """Softmax regression weights (reps, k + 1, classes) by SGD with momentum, weight decay and a cosine schedule."""
    reps, n, k1 = xb.shape
    classes = onehot.shape[1]
    gen = torch.Generator().manual_seed(seed)
    w = torch.zeros(reps, k1, classes)
    velocity = torch.zeros_like(w)
    total, step = epochs * math.ceil(n / batch_size), 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for s in range(0, n, batch_size):
            idx = order[s : s + batch_size]
            x = xb[:, idx]
            residual = _softmax(x @ w) - onehot[idx]
            grad = x.transpose(1, 2) @ residual / len(idx) + weight_decay * w
            velocity.mul_(momentum).add_(grad)
            w.sub_(velocity, alpha=lr * 0.5 * (1 + math.cos(math.pi * step / total)))  # cosine schedule
            step += 1
    return w


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last axis, written out: torch's CPU kernel takes ~12 ms on a (50, 256, 10) batch of logits
    here (the random-subset probes' step), this ~2 ms; equal to it within float32 rounding (~2e-7)."""
    e = (logits - logits.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


def paired_difference(first: torch.Tensor, second: torch.Tensor, draws: int = 10000, seed: int = 0) -> dict:
    """first's accuracy minus second's on the same test samples (`probe_correct` rows), with a 95 % percentile
    bootstrap interval over the test set. Only the samples exactly one of the two gets right move the difference,
    so a resample is a multinomial draw of (first only, second only, the rest): exact, O(draws) for any test set."""
    n = len(first)
    first_only = int(((first > 0) & (second == 0)).sum())
    second_only = int(((first == 0) & (second > 0)).sum())
    p = np.array([first_only, second_only, n - first_only - second_only], dtype=np.float64) / n
    counts = np.random.default_rng(seed).multinomial(n, p, size=draws)
    low, high = np.quantile((counts[:, 0] - counts[:, 1]) / n, [0.025, 0.975])
    return {
        "difference": (first_only - second_only) / n,
        "low": float(low),
        "high": float(high),
        "first_only": first_only,
        "second_only": second_only,
        "n": n,
    }


def _row_blocks(x: torch.Tensor, block: int = 65536, axis: int = 0):
    """float64 copies of `block` rows (along `axis`) at a time (never the whole matrix in float64)."""
    for s in range(0, x.shape[axis], block):
        yield x.narrow(axis, s, min(block, x.shape[axis] - s)).to(torch.float64)


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
        rows[key] = {
            "k": k,
            "k_on_grid": on_grid(k),
            **{f"agrees_{x}pt": on_grid(k) == measured.get(f"accuracy_within_{x}pt") for x in (1, 5)},
        }
    return {"suggested": rows, "measured": {f"{x}pt": measured.get(f"accuracy_within_{x}pt") for x in (1, 5)}}
