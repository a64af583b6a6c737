"""Checks on the order of an export's eigenvalues."""

import torch


def assert_descending_outside_ties(values: torch.Tensor, ties: dict | None) -> None:
    """Eigenvalues descend from each group ties=variance reordered (manifest "ties": ordered by variance inside,
    each value a feature's Rayleigh quotient) to the next, and within no group is anything out of order beyond it."""
    groups = (ties or {}).get("groups") or []
    starts = {a - 1: b for a, b in groups}
    blocks, i = [], 0
    while i < len(values):
        end = starts.get(i, i + 1)
        blocks.append(values[i:end])
        i = end
    for upper, lower in zip(blocks, blocks[1:]):
        assert upper.min() >= lower.max() - 1e-12, (values, groups)
