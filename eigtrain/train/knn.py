"""Weighted cosine kNN accuracy on prefixes: the online monitor's score, and one of eigtrain-eval's."""

from __future__ import annotations

import torch

from eigtrain.objectives.nesting import mrl_prefixes

F32 = torch.float32


def dims_for(d: int) -> list[int]:
    """{4, 8, 16, ..., d} (d always included): the paper's representation sizes."""
    return mrl_prefixes(d)


def knn_accuracy(train_x, train_y, test_x, test_y, k: int = 20, temperature: float = 0.07) -> float:
    """Weighted cosine kNN (the usual SSL protocol: k=20, weights exp(sim / 0.07))."""
    a = torch.nn.functional.normalize(train_x.to(F32), dim=1)
    b = torch.nn.functional.normalize(test_x.to(F32), dim=1)
    classes = int(max(train_y.max(), test_y.max())) + 1
    sims, idx = (b @ a.T).topk(min(k, len(a)), dim=1)
    votes = torch.zeros(len(b), classes).scatter_add_(1, train_y.long()[idx], (sims / temperature).exp())
    return (votes.argmax(1) == test_y.long()).to(F32).mean().item()
