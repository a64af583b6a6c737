"""Objectives for ordered representation learning (pure tensor code: no I/O, no config objects).

    from eigtrain.objectives import build_objective
    objective = build_objective("scl", dim=128, nesting="joint", prefixes="mrl")
    loss, terms = objective(z1, z2)   # terms: detached loss terms + terms["eigenvalues"] (dim,)

When a process group is initialized (and distributed=True) the estimates are over the global batch.
"""

from __future__ import annotations

from typing import Sequence

from eigtrain.objectives.base import Objective
from eigtrain.objectives.lora import SCL, LoRA
from eigtrain.objectives.nesting import Nesting, mrl_prefixes
from eigtrain.objectives.rq import RQ, RQDirect
from eigtrain.objectives.vicreg import VICReg
from eigtrain.objectives.vicreg_paper import VICRegPaper

OBJECTIVES: dict[str, type[Objective]] = {c.name: c for c in (LoRA, SCL, RQ, RQDirect, VICReg, VICRegPaper)}


def build_objective(
    name: str,
    dim: int,
    nesting: str = "none",
    prefixes: Sequence[int] | str | None = None,
    weights: Sequence[float] | None = None,
    distributed: bool = True,
    pairs: bool | None = None,
    **coefficients,
) -> Objective:
    """Build an objective module; raises ValueError naming any bad argument.

    name: lora (two encoders, SVD case) | scl (one encoder, two views) | rq | rq_direct | vicreg (the
    common 25/25/1 form) | vicreg_paper (the paper's equation, appendix G).
    nesting: none | joint | sequential; prefixes: None/'all' (every prefix), 'mrl' ({4, 8, ..., dim})
    or a list inside 1..dim; weights: positive, default uniform 1/|K|.
    pairs: two encoders on stored pairs (default True for lora, False otherwise).
    coefficients: family options (lora/scl: center, normalize, constant_mode; rq/rq_direct: mu, nu, center;
    vicreg: sim_coeff, std_coeff, cov_coeff, eps; vicreg_paper: lam, mu, nu, eps).
    """
    if name not in OBJECTIVES:
        raise ValueError(f"objective={name!r} is unknown; allowed: {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name](dim, Nesting(nesting, dim, prefixes, weights), distributed, pairs, **coefficients)


__all__ = ["build_objective", "Objective", "Nesting", "mrl_prefixes", "OBJECTIVES"]
