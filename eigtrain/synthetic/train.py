"""Training loop: one encoder per run on both views of exact P+ pairs; several runs of one configuration
(seeds, objectives) train together as one batched ensemble (eigtrain.synthetic.ensemble)."""

import math
import sys
import time

import torch

from eigtrain.objectives import build_objective
from eigtrain.synthetic.config import SyntheticConfig
from eigtrain.synthetic.ensemble import EnsembleEncoder, MemberAdam
from eigtrain.synthetic.kernels import SyntheticKernel
from eigtrain.synthetic.model import SyntheticEncoder
from eigtrain.synthetic.sampler import sample_pairs

MAX_SKIPPED_STEPS = 10
# Independent random streams per seed: weights (torch.manual_seed), training pairs, extraction pairs, evaluation.
STREAM_TRAIN, STREAM_EXTRACT, STREAM_EVAL = 1, 2, 3


def generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(1_000_003 * stream + seed)


def learning_rate(cfg: SyntheticConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    final = cfg.lr * cfg.final_lr_ratio
    return final + (cfg.lr - final) * 0.5 * (1 + math.cos(math.pi * progress))


def objective_coefficients(cfg: SyntheticConfig) -> dict:
    """The paper's synthetic setting: mu = 10, nu = 30 for RQ and VICReg (appendix G).

    vicreg_paper is the paper's VICReg equation; the synthetic section sets mu = 10, nu = 30 and no lambda,
    and RQ's invariance term (which, per the paper's RQ/VICReg comparison, VICReg computes "in the same
    way") has coefficient 1, hence lam = 1. `vicreg` (the common form) divides the covariance sum by d and
    sums it over both views: cov_coeff = nu / (2 (d - 1)) gives the same penalty.
    """
    if cfg.objective == "vicreg_paper":
        return {"lam": 1.0, "mu": 10.0, "nu": 30.0}
    if cfg.objective == "vicreg":
        return {"sim_coeff": float(cfg.dim), "std_coeff": 10.0, "cov_coeff": 30.0 / (2 * max(1, cfg.dim - 1))}
    if cfg.objective in ("rq", "rq_direct"):
        return {"mu": 10.0, "nu": 30.0}
    # The paper's LoRA: the encoder learns the constant (constant_mode=learned) or outputs it (fixed) itself.
    return {"constant_mode": "none"}


class PairStream:
    """Batches of P+ pairs: fresh draws (train_samples = 0), or a pool of train_samples pairs reused across
    epochs (the paper: 10^7). The pool is filled lazily: epoch 1 takes pairs in the order they are drawn
    (i.i.d., hence already in random order), later epochs a fresh permutation of the stored pool, so a run
    shorter than one epoch never materializes pairs it does not use. training_pairs() returns the pairs
    drawn so far (the paper's Rayleigh-Ritz pass "using all training samples")."""

    def __init__(self, kernel: SyntheticKernel, cfg: SyntheticConfig, gen: torch.Generator):
        self.kernel, self.batch_size, self.gen = kernel, cfg.batch_size, gen
        self.pool_size = cfg.train_samples
        self.chunks: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.drawn, self.pool, self.order, self.cursor = 0, None, None, 0

    def next(self):
        if not self.pool_size:
            return sample_pairs(self.kernel, self.batch_size, self.gen)
        if self.drawn < self.pool_size:  # first epoch: draw and keep
            batch = sample_pairs(self.kernel, self.batch_size, self.gen)
            self.chunks.append(batch)
            self.drawn += self.batch_size
            return batch
        if self.pool is None:
            self.pool = self.training_pairs()
        if self.order is None or self.cursor + self.batch_size > self.pool_size:
            self.order, self.cursor = torch.randperm(self.pool_size, generator=self.gen), 0
        idx = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return self.pool[0][idx], self.pool[1][idx]

    def training_pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pool is not None:
            return self.pool
        if not self.chunks:
            raise ValueError("no stored training pairs: train_samples=0 draws fresh pairs (use extraction_pairs=fresh)")
        return torch.cat([c[0] for c in self.chunks]), torch.cat([c[1] for c in self.chunks])


# Keys that change how the encoders train: members of one ensemble must agree on all of them.
TRAINING_KEYS = (
    "kernel",
    "rank",
    "input_dim",
    "constant_mode",
    "steps",
    "batch_size",
    "lr",
    "schedule",
    "warmup_steps",
    "adam_beta1",
    "adam_beta2",
    "final_lr_ratio",
    "fourier_features",
    "width",
    "depth",
    "train_samples",
    "rr_tail",
)


def build_encoder(cfg: SyntheticConfig, kernel: SyntheticKernel) -> SyntheticEncoder:
    torch.manual_seed(cfg.seed)
    return SyntheticEncoder(
        kernel.name,
        kernel.input_dim,
        kernel.rank,
        cfg.dim,
        cfg.width,
        cfg.depth,
        fixed_constant=cfg.constant_mode == "fixed",
        fourier_products=cfg.fourier_features == "products",
    )


def check_ensemble(cfgs: list[SyntheticConfig]) -> None:
    if not cfgs:
        raise ValueError("an ensemble needs at least one run")
    for key in TRAINING_KEYS:
        values = {getattr(c, key) for c in cfgs}
        if len(values) > 1:
            raise ValueError(f"ensemble members must share {key}, got {sorted(values, key=str)}")


def train(cfgs: list[SyntheticConfig], kernel: SyntheticKernel, tail_accumulators=None):
    """Train one encoder per config as one ensemble; batches of the final rr_tail fraction of steps also
    feed tail_accumulators[m].

    Returns (ensemble, histories, streams): histories[m] is member m's list of logged dicts, streams maps
    each seed to its PairStream (the training pairs)."""
    check_ensemble(cfgs)
    cfg = cfgs[0]
    ensemble = EnsembleEncoder([build_encoder(c, kernel) for c in cfgs])
    objectives = [
        build_objective(
            c.objective,
            c.dim,
            nesting="joint" if c.extraction == "joint" else "none",
            distributed=False,
            pairs=False,
            **objective_coefficients(c),
        )
        for c in cfgs
    ]
    seeds = sorted({c.seed for c in cfgs})
    streams = {s: PairStream(kernel, cfg, generator(s, STREAM_TRAIN)) for s in seeds}
    member_seed = torch.tensor([seeds.index(c.seed) for c in cfgs])
    params = list(ensemble.parameters())
    optimizer = MemberAdam(params, len(cfgs), betas=(cfg.adam_beta1, cfg.adam_beta2))
    tail_start = cfg.steps - round(cfg.rr_tail * cfg.steps)
    n = cfg.batch_size

    histories: list[list[dict]] = [[] for _ in cfgs]
    skipped = torch.zeros(len(cfgs), dtype=torch.long)
    start = time.perf_counter()
    for step in range(cfg.steps):
        lr = learning_rate(cfg, step)
        batches = [torch.cat(streams[s].next()) for s in seeds]
        z = ensemble(torch.stack(batches)[member_seed])  # (M, 2n, d): one forward for both views
        outputs = [obj(zm[:n], zm[n:]) for obj, zm in zip(objectives, z)]
        losses, terms = torch.stack([loss for loss, _ in outputs]), [t for _, t in outputs]
        for p in params:
            p.grad = None
        losses.sum().backward()  # members share no parameters: each gets its own loss's gradient
        finite, skipped = _finite_steps(losses, params, skipped, cfgs, step)
        optimizer.step(lr, finite)
        if tail_accumulators is not None and step >= tail_start:
            for m, acc in enumerate(tail_accumulators):
                if finite[m]:
                    acc.update(z[m, :n].detach().double(), z[m, n:].detach().double())
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            elapsed = time.perf_counter() - start
            for m in range(len(cfgs)):
                histories[m].append(
                    {
                        "step": step + 1,
                        "loss": losses[m].item(),
                        "lr": lr,
                        "eigenvalues": [round(v, 5) for v in terms[m]["eigenvalues"].tolist()],
                        "seconds": round(elapsed, 1),
                    }
                )
            print(
                f"step {step + 1}/{cfg.steps} lr {lr:.2e} losses {[round(v, 5) for v in losses.tolist()]} "
                f"{(step + 1) / elapsed:.1f} steps/s ({len(cfgs)} runs)",
                file=sys.stderr,
                flush=True,
            )
    return ensemble, histories, streams


def _finite_steps(losses, params, skipped, cfgs, step: int):
    """Which members' losses and gradients are finite (only those step: never apply a non-finite update), and the
    consecutive-skip counts; too many in a row for any member is an error naming the runs."""
    finite = torch.isfinite(losses)
    for p in params:
        finite &= torch.isfinite(p.grad.flatten(1)).all(1)
    skipped = torch.where(finite, 0, skipped + 1)  # never apply a non-finite step
    if (skipped > MAX_SKIPPED_STEPS).any():
        bad = torch.nonzero(skipped > MAX_SKIPPED_STEPS).flatten().tolist()
        raise FloatingPointError(
            f"non-finite loss or gradient in {MAX_SKIPPED_STEPS + 1} consecutive steps for run(s) "
            f"{[f'{cfgs[m].objective}-{cfgs[m].extraction} seed {cfgs[m].seed}' for m in bad]} (step {step}); lower lr"
        )
    return finite, skipped


def train_single(cfg: SyntheticConfig, kernel: SyntheticKernel) -> SyntheticEncoder:
    """One run, unbatched: nn.Linear layers and torch.optim.Adam, as one process per run trains. The
    reference that the ensemble's members must equal (tests) and the baseline of its speed-up (tools)."""
    encoder = build_encoder(cfg, kernel)
    objective = build_objective(
        cfg.objective,
        cfg.dim,
        nesting="joint" if cfg.extraction == "joint" else "none",
        distributed=False,
        pairs=False,
        **objective_coefficients(cfg),
    )
    optimizer = torch.optim.Adam(encoder.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2))
    stream = PairStream(kernel, cfg, generator(cfg.seed, STREAM_TRAIN))
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        a, a_pos = stream.next()
        z1, z2 = encoder(torch.cat([a, a_pos])).chunk(2)
        loss, _ = objective(z1, z2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return encoder
