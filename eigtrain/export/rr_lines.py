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
    """One line on which prefixes the data determine (rr_prefixes.cut_errors), with the folds. sizes."""
    bad = cuts["undetermined"]
    if not bad:
        return (
            f"eigtrain-rr: the data determine every cut of the {width} features ({len(cuts['folds_n'])} folds of "
            f"{min(cuts['folds_n'])}+ samples): every prefix is the span of the top-k estimated eigenfunctions"
        )
    shown = _spans(bad)
    return (
        f"eigtrain-rr: the data do not determine the cut after feature(s) {shown} of {width} (the gap there is "
        f"within its sampling noise across folds): a prefix ending there is one of several equally good ones; "
        f"every other prefix is determined"
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
