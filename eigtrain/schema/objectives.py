"""The objective group's dataclasses: one per objective (eigtrain/objectives), every key with its default and doc.

The objectives read their coefficients' defaults from here (`coefficients_of`), so each is written once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import MISSING

Reduction = Literal["auto", "moments", "gather"]  # eigtrain.objectives.moments.REDUCTIONS
Normalize = Literal["none", "full", "prefix"]  # eigtrain.objectives.lora.NORMALIZE
ConstantMode = Literal["none", "fixed"]  # eigtrain.objectives.lora.CONSTANT_MODES


@dataclass
class ObjectiveBase:
    name: str = MISSING  # lora | scl | rq | rq_direct | vicreg | vicreg_paper (OBJECTIVE_SCHEMAS)
    reduction: str = "auto"  # statistics across ranks: auto (the cheaper of the two) | moments (all-reduce) | gather
    # auto's choice: matmul flop/s over per-rank link bytes/s (an H100 on NVSwitch or 8 NICs: 125; one NIC: ~1,000)
    reduction_flops_per_byte: float = 125.0  # auto: the machine's matmul flop/s over its per-rank link bytes/s


@dataclass
class LoraConfig(ObjectiveBase):
    name: str = "lora"  # low-rank approximation: two encoders (phi, psi) on stored pairs, SVD case
    center: bool = False  # subtract the batch mean from f and g (needs constant_mode=none)
    normalize: str = "none"  # none | full (l2 per sample) | prefix (l2 per nested prefix)
    # fixed: measured better for l2-normalized SCL, equal within noise unnormalized (benchmarks/jn_constant.md)
    constant_mode: str = "fixed"  # fixed (the constant function held outside the nested prefixes) | none


@dataclass
class SclConfig(LoraConfig):
    name: str = "scl"  # spectral contrastive loss: one encoder on two views


@dataclass
class RqConfig(ObjectiveBase):
    name: str = "rq"  # Rayleigh quotient with split-batch penalties (an even per-rank micro-batch)
    mu: float = 10.0  # weight of the normalization penalty (mu/d) sum_i (E[f_i^2] - 1)^2
    nu: float = 30.0  # weight of the decorrelation penalty (nu/(d(d-1))) sum_{i != j} E[f_i f_j]^2
    center: bool = False  # subtract the batch mean from f and g first


@dataclass
class RqDirectConfig(RqConfig):
    name: str = "rq_direct"  # RQ with the off-diagonal penalty on the cross moment: eigenfunctions in order


@dataclass
class VicregConfig(ObjectiveBase):
    name: str = "vicreg"  # VICReg, the common 25/25/1 form (statistics over the global batch)
    sim_coeff: float = 25.0  # weight of the invariance term mse(f, g)
    std_coeff: float = 25.0  # weight of the variance term mean_i relu(1 - sqrt(var_i + eps))
    cov_coeff: float = 1.0  # weight of the covariance term sum_{i != j} C_ij^2 / d
    eps: float = 1e-4  # added to each variance under the square root


@dataclass
class VicregPaperConfig(ObjectiveBase):
    name: str = "vicreg_paper"  # VICReg as the paper writes it (appendix G)
    lam: float = 50.0  # weight of the invariance term lam/n sum ||psi(a) - psi(a+)||^2
    mu: float = 25.0  # weight of the variance term mu/d sum relu(1 - sqrt(C_ii + eps))
    nu: float = 512.0  # weight of the covariance term nu/(d(d-1)) sum_{i != j} C_ij^2
    eps: float = 1e-4  # added to each variance under the square root


OBJECTIVE_SCHEMAS: dict[str, type[ObjectiveBase]] = {
    c.name: c for c in (LoraConfig, SclConfig, RqConfig, RqDirectConfig, VicregConfig, VicregPaperConfig)
}
Objective = Literal["lora", "scl", "rq", "rq_direct", "vicreg", "vicreg_paper"]  # eigtrain.objectives.OBJECTIVES


def _defaults(schema: type, names: set[str] | None, exclude: set[str]) -> dict[str, Any]:
    return {
        f.name: f.default
        for f in dataclasses.fields(schema)
        if f.name not in exclude and (names is None or f.name in names)
    }


_COMMON = {f.name for f in dataclasses.fields(ObjectiveBase)}


def coefficients_of(schema: type) -> dict[str, Any]:
    """The family coefficients of an objective's dataclass and their defaults (not name, not the reduction keys)."""
    return _defaults(schema, None, _COMMON)


def common_options() -> dict[str, Any]:
    """The keys every objective takes besides its coefficients, and their defaults (reduction, ...)."""
    return _defaults(ObjectiveBase, _COMMON, {"name"})
