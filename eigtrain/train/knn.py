"""Weighted cosine kNN accuracy on prefixes: the online monitor's score, and one of eigtrain-eval's."""

from __future__ import annotations

import torch

from eigtrain.objectives.nesting import mrl_prefixes

F32 = torch.float32


def dims_for(d: int) -> list[int]:
    """{4, 8, 16, ..., d} (d always included): the paper's representation sizes."""
    return mrl_prefixes(d)


def knn_accuracy(
    train_x, train_y, test_x, test_y, k: int = 20, temperature: float = 0.07, block_elements: int = 1 << 26
) -> float:
    """Weighted cosine kNN (the usual SSL protocol: k=20, weights exp(sim / 0.07)); the test rows are scored in
    blocks of at most `block_elements` similarities (256 MB), so 60,000 x 10,000 never forms whole."""
    a = torch.nn.functional.normalize(train_x.to(F32), dim=1)
    b = torch.nn.functional.normalize(test_x.to(F32), dim=1)
    classes = int(max(train_y.max(), test_y.max())) + 1
    labels, correct = train_y.long(), 0
    rows = max(1, block_elements // max(len(a), 1))  # test rows per block: at most `block_elements` similarities
    for s in range(0, len(b), rows):
        sims, idx = (b[s : s + rows] @ a.T).topk(min(k, len(a)), dim=1)
        votes = torch.zeros(len(sims), classes).scatter_add_(1, labels[idx], (sims / temperature).exp())
        correct += int((votes.argmax(1) == test_y[s : s + rows].long()).sum())
    return (torch.tensor(correct, dtype=F32) / max(len(b), 1)).item()  # the float32 mean, as one block gave it
