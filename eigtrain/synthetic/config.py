"""Configuration of one synthetic run, composed from its key=value command line like every eigtrain command."""

import dataclasses
from dataclasses import dataclass

from eigtrain.cli import compose_dataclass
from eigtrain.schema.objectives import OBJECTIVE_SCHEMAS

# torch-free: eigtrain-synthetic checks its command line before torch is imported (eigtrain.commands)
OBJECTIVES = tuple(OBJECTIVE_SCHEMAS)  # every objective eigtrain trains with runs here too (its registry's names)
KERNELS = ("legendre", "fourier", "fourier_sum")  # eigtrain.synthetic.kernels builds them
MEAN_INVARIANT = ("vicreg", "vicreg_paper")  # losses of centered features only (eigtrain.synthetic.extract)
EXTRACTIONS = ("joint", "rr")
RR_MODES = ("generalized", "paper")
JN_READOFFS = ("gs", "paper")
EXTRACTION_PAIRS = ("fresh", "train")
SCHEDULES = ("constant", "cosine")
CONSTANT_MODES = ("learned", "fixed")
FOURIER_FEATURES = ("paper", "products")
# preset=NAME applies these first; explicit keys still win.
PRESETS = {
    # The paper's recipe as written in appendix G (benchmarks/synthetic.md lists the readings where it is
    # silent): learned constant mode, its features, Adam 1e-3 constant, 3e5 steps over a pool of 1e7 pairs,
    # plain joint-nesting read-off with the theory's eigenvalues, appendix F's Rayleigh-Ritz, both on the
    # training pairs.
    "paper": {
        "steps": 300_000,
        "train_samples": 10_000_000,
        "lr": 1e-3,
        "schedule": "constant",
        "constant_mode": "learned",
        "fourier_features": "paper",
        "rr_mode": "paper",
        "jn_readoff": "paper",
        "extraction_pairs": "train",
        "eval_samples": 1_000_000,
    },
    # eigtrain's recipe, each change named: cosine decay; Adam beta2 = 0.99 (the learned constant's early
    # gradients otherwise shrink the other modes' steps for thousands of steps); Fourier tensor-product
    # features; generalized Rayleigh-Ritz; Gram-Schmidt read-off with Rayleigh-quotient eigenvalues; fresh
    # pairs for training and for extraction. The constant mode is learned (constant_mode=fixed is the
    # separately reported variant); lr 3e-3.
    "eigtrain": {
        "steps": 30_000,
        "train_samples": 0,
        "lr": 3e-3,
        "adam_beta2": 0.99,
        "schedule": "cosine",
        "constant_mode": "learned",
        "fourier_features": "products",
        "rr_mode": "generalized",
        "jn_readoff": "gs",
        "extraction_pairs": "fresh",
        "eval_samples": 1_000_000,
    },
}


@dataclass
class SyntheticConfig:
    preset: str = ""  # paper | eigtrain (the recipes in PRESETS); empty: the defaults below
    kernel: str = "legendre"  # legendre (p = 1) | fourier (p = 2)
    rank: int = 8  # kernel rank r; the encoder extracts d = r / 2 eigenpairs
    input_dim: int = 0  # p; 0 = the paper's (1 for legendre, 2 for fourier)
    objective: str = "scl"  # a name of eigtrain's objectives registry (lora = scl here: one encoder, two views)
    extraction: str = "joint"  # joint: train with joint nesting | rr: train plain, then Rayleigh-Ritz
    # fixed: coordinate 1 is the constant function, the top eigenfunction of every such kernel | learned (the paper)
    constant_mode: str = "fixed"  # fixed (coordinate 1 is the constant function) | learned (the paper)
    rr_mode: str = "generalized"  # generalized (exact in any basis) | paper (appendix F per objective)
    # joint nesting's read-off: gs (Gram-Schmidt in feature order, Rayleigh-quotient eigenvalues) | paper
    # (features as they are; eigenvalue ||f_i||^2 for LoRA/SCL, E[f_i(a) f_i(a+)] for RQ/VICReg)
    jn_readoff: str = "gs"  # joint nesting's read-off: gs (Gram-Schmidt in feature order) | paper
    # pairs for extraction and eigenvalues: fresh (rr_samples new pairs) | train (every training pair drawn)
    extraction_pairs: str = "fresh"  # pairs for extraction and eigenvalues: fresh | train
    # Optimization: the paper's Adam 1e-3 with batch 1000; a cosine decay settles the functions late.
    steps: int = 5_000  # optimizer steps
    batch_size: int = 1000  # pairs per step
    lr: float = 1e-3  # Adam's peak learning rate
    schedule: str = "cosine"  # constant (the paper) | cosine
    warmup_steps: int = 0  # linear warmup from 0
    # Adam's moment decays (torch's defaults). With the constant mode learned, its early large gradients
    # fill the shared layers' second moment; beta2 sets how long they keep shrinking the other modes' steps.
    adam_beta1: float = 0.9  # Adam's first-moment decay
    adam_beta2: float = 0.999  # Adam's second-moment decay
    final_lr_ratio: float = 0.0  # cosine ends at lr * final_lr_ratio
    # paper: cos(i pi a_j) per coordinate; products: prod_j cos(i_j pi a_j), the analogue of the monomials.
    # With the paper's features nothing beyond the constant is learned in 5e3 steps: use products, lr=3e-3.
    fourier_features: str = "paper"  # fourier kernel: paper (per coordinate) | products
    width: int = 128  # the MLP encoder's hidden width
    depth: int = 4  # the MLP encoder's hidden layers
    # Data: 0 draws fresh pairs every step; N > 0 cycles over a fixed set of N pairs (the paper: 10^7).
    train_samples: int = 0  # 0: fresh pairs every step; N: cycle over a fixed set of N pairs
    # Extraction and eigenvalues use moments of pairs: the final rr_tail fraction of training batches
    # (free; the paper's Rayleigh-Ritz uses all training samples) plus rr_samples fresh pairs.
    rr_tail: float = 0.0  # the final fraction of training batches whose moments extraction also uses
    rr_samples: int = 1_000_000  # fresh pairs for extraction and eigenvalues
    eval_samples: int = 1_000_000  # fresh a ~ uniform for EF-MSE
    seed: int = 0  # weights, pairs and draws
    threads: int = 1  # torch intra-op threads
    log_every: int = 1000  # steps between progress lines
    out: str = ""  # JSON result file; empty = print only

    @property
    def dim(self) -> int:
        return self.rank // 2

    def validate(self) -> "SyntheticConfig":
        choices = {
            "kernel": KERNELS,
            "objective": OBJECTIVES,
            "extraction": EXTRACTIONS,
            "rr_mode": RR_MODES,
            "jn_readoff": JN_READOFFS,
            "extraction_pairs": EXTRACTION_PAIRS,
            "constant_mode": CONSTANT_MODES,
            "fourier_features": FOURIER_FEATURES,
            "schedule": SCHEDULES,
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key}={getattr(self, key)!r} is not allowed; allowed: {', '.join(allowed)}")
        positive = ("rank", "steps", "batch_size", "width", "depth", "eval_samples", "threads", "log_every")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key}={getattr(self, key)}: must be positive")
        if self.rank < 2 or self.rank % 2:
            raise ValueError(f"rank={self.rank}: must be an even number >= 2 (the encoder extracts d = rank / 2)")
        if self.constant_mode == "fixed" and self.objective in MEAN_INVARIANT:
            raise ValueError(
                f"constant_mode=fixed with objective={self.objective}: VICReg's loss sees centered features only, "
                "so its features estimate psi_2..psi_(d+1) and a fixed constant coordinate has nothing to estimate"
            )
        if self.constant_mode == "fixed" and self.dim < 2:
            raise ValueError(
                f"constant_mode=fixed needs d = rank / 2 >= 2 (one fixed and one learned function), got rank={self.rank}"
            )
        if self.batch_size % 2:
            raise ValueError(f"batch_size={self.batch_size}: must be even (split-batch estimators use even/odd halves)")
        if self.lr <= 0 or not 0 <= self.final_lr_ratio <= 1:
            raise ValueError(
                f"lr={self.lr}, final_lr_ratio={self.final_lr_ratio}: need lr > 0 and 0 <= final_lr_ratio <= 1"
            )
        if not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1):
            raise ValueError(f"adam_beta1={self.adam_beta1}, adam_beta2={self.adam_beta2}: each must be in [0, 1)")
        if not 0 <= self.rr_tail <= 1:
            raise ValueError(f"rr_tail={self.rr_tail}: must be a fraction in [0, 1]")
        if self.rr_samples < 0 or self.train_samples < 0 or self.warmup_steps < 0 or self.input_dim < 0:
            raise ValueError("rr_samples, train_samples, warmup_steps and input_dim must be >= 0")
        if 0 < self.train_samples < self.batch_size:
            raise ValueError(
                f"train_samples={self.train_samples}: must be 0 (fresh pairs) or >= batch_size={self.batch_size}"
            )
        if self.train_samples % self.batch_size:
            raise ValueError(f"train_samples={self.train_samples}: must be a multiple of batch_size={self.batch_size}")
        if self.extraction_pairs == "train" and not self.train_samples:
            raise ValueError(
                "extraction_pairs=train needs a training pool (train_samples > 0); fresh pairs are not kept"
            )
        if self.extraction_pairs == "fresh" and self.rr_samples == 0 and self.rr_tail == 0:
            raise ValueError(
                "rr_samples=0 and rr_tail=0: no pairs left to estimate eigenvalues and extract eigenfunctions"
            )
        return self


def parse_run_args(argv: list[str]) -> SyntheticConfig:
    """One run's config from key=value arguments (`preset=NAME` first, explicit keys win); not yet validated.
    Unknown keys and wrong types are one ValueError line, as for every eigtrain command (eigtrain.cli)."""
    return compose_dataclass(SyntheticConfig, argv, groups={"preset": PRESETS})


def stored_with_defaults(stored: dict) -> dict:
    """A config stored by an earlier version: the keys added since count as their defaults (what it ran with)."""
    return {**dataclasses.asdict(SyntheticConfig()), **stored}


USAGE = (
    """eigtrain-synthetic: one run, or a table over a grid of runs.

  eigtrain-synthetic kernel=KERNEL rank=8 objective=OBJECTIVE extraction=joint|rr steps=N seed=S out=FILE.json \\
      [any SyntheticConfig key=value]
  eigtrain-synthetic preset=paper|eigtrain ...   the paper's recipe (appendix G) or eigtrain's
  eigtrain-synthetic grid recipe=paper|eigtrain kernels=legendre,fourier ranks=8,6,10 seeds=0,1,2,3,4 \\
      dir=DIR steps=N    one batched ensemble (6 methods x seeds) per (kernel, rank), one compact JSON each
  eigtrain-synthetic table recipes=paper,eigtrain dir=benchmarks/synthetic out=benchmarks/synthetic/table.md
      renders the grid's cell files as the paper's Table 1 (runs nothing)
"""
    + f"KERNEL: {', '.join(KERNELS)}\nOBJECTIVE: {', '.join(OBJECTIVES)}"
)  # eigtrain-synthetic -h (eigtrain.commands): read before torch is imported
