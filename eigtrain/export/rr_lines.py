"""The lines eigtrain-rr prints about its export: how the dimensions were spent, which cuts the data determine,
which groups were reordered."""

from __future__ import annotations


def dimensions_line(dims: dict) -> str:
    """One line on how the embedding's dimensions were spent (both sides for svd)."""
    sides = [("", dims)] + ([("a-side: ", dims["right"])] if "right" in dims else [])
    parts = [
        f"{p}{d['features']} ordered features from {d['dim']} dimensions ({d['dead']} dead, {d['dependent']} "
        f"dependent{', 1 spanning the constant' if d['constant'] else ''})"
        for p, d in sides
    ]
    return "eigtrain-rr: " + "; ".join(parts)


def cuts_line(cuts: dict, width: int) -> str:
    """One line on which prefixes the data determine (prefixes.cut_errors), with the folds' sizes; cuts past the
    tested ones (the first 256) are said to be untested, never determined."""
    bad, tested = cuts["undetermined"], cuts.get("tested", width - 1)
    untested = f"; the cuts after features {tested + 1}-{width - 1} were not tested" if tested < width - 1 else ""
    if not bad:
        return (
            f"eigtrain-rr: the data determine every tested cut of the {width} features (after features 1-{tested}; "
            f"{len(cuts['folds_n'])} folds of {min(cuts['folds_n'])}+ samples){untested}"
        )
    return (
        f"eigtrain-rr: the data do not determine the cut after feature(s) {_spans(bad)} of {width} (the gap there is "
        f"within its sampling noise across folds): a prefix ending there is one of several equally good ones; "
        f"every other tested cut is determined{untested}"
    )


def _spans(numbers: list[int], most: int = 12) -> str:
    """1, 2, 3, 7 -> '1-3, 7' (at most `most` spans, then how many more)."""
    spans: list[list[int]] = []
    for k in numbers:
        if spans and k == spans[-1][1] + 1:
            spans[-1][1] = k
        else:
            spans.append([k, k])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:most]]
    return ", ".join(text) + (f" and {len(spans) - most} more" if len(spans) > most else "")


def ties_line(ties: dict) -> str:
    """One line on the groups reordered by variance (ties=variance)."""
    spans = ", ".join(f"{a}-{b}" for a, b in ties["groups"])
    return (
        f"eigtrain-rr: ties=variance: features {spans} reordered by the embedding's variance (not the kernel's order)"
    )


WIDE_AGAINST_N = 0.1  # d / n from which the sample eigenvalues, not only their order, are visibly biased


def width_line(dim: int, n: int) -> str:
    """A warning when the embedding's width is not small against the pairs: Rayleigh-Ritz fits d x d moments, and
    with d / n of 0.1 or more its top eigenvalues are biased upward (the solve fits the sample's noise: at d = 256,
    n = 300 every eigenvalue comes out near 1), '' otherwise."""
    if dim < WIDE_AGAINST_N * n:
        return ""
    return (
        f"eigtrain-rr: warning: d = {dim} is not small against n = {n} pairs (d/n = {dim / n:.2f}): the eigenvalues "
        f"are biased upward by the fit, not only their order; reduce more pairs (or fewer dimensions) for their values"
    )
