"""Training loop for one synthetic run: one encoder on both views of exact P+ pairs."""

import math
import sys
import time

import torch

from eigtrain.objectives import build_objective
from eigtrain.synthetic.config import SyntheticConfig
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

    VICReg as in the paper's eq.: sim * mse + (mu/d) sum relu(1 - std) + (nu/(d(d-1))) sum_{i!=j} C_ij^2;
    eigtrain's VICReg divides the covariance sum by d, hence cov_coeff = nu / (d - 1).
    """
    if cfg.objective == "vicreg":
        return {"sim_coeff": 1.0, "std_coeff": 10.0, "cov_coeff": 30.0 / max(1, cfg.dim - 1)}
    if cfg.objective in ("rq", "rq_direct"):
        return {"mu": 10.0, "nu": 30.0}
    return {}


class PairStream:
    """Batches of P+ pairs: fresh draws, or epochs over a fixed set of train_samples pairs (the paper)."""

    def __init__(self, kernel: SyntheticKernel, cfg: SyntheticConfig, gen: torch.Generator):
        self.kernel, self.batch_size, self.gen = kernel, cfg.batch_size, gen
        self.pool = sample_pairs(kernel, cfg.train_samples, gen) if cfg.train_samples else None
        self.order, self.cursor = None, 0

    def next(self):
        if self.pool is None:
            return sample_pairs(self.kernel, self.batch_size, self.gen)
        n = self.pool[0].shape[0]
        if self.order is None or self.cursor + self.batch_size > n:
            self.order, self.cursor = torch.randperm(n, generator=self.gen), 0
        idx = self.order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        return self.pool[0][idx], self.pool[1][idx]


def train(cfg: SyntheticConfig, kernel: SyntheticKernel, tail_accumulator=None):
    """Train the encoder; batches of the final rr_tail fraction of steps also feed tail_accumulator.

    Returns (encoder, history) with history a list of logged dicts.
    """
    torch.manual_seed(cfg.seed)
    encoder = SyntheticEncoder(
        kernel.name,
        kernel.input_dim,
        kernel.rank,
        cfg.dim,
        cfg.width,
        cfg.depth,
        fixed_constant=cfg.constant_mode == "fixed",
        fourier_products=cfg.fourier_features == "products",
    )
    nesting = "joint" if cfg.extraction == "joint" else "none"
    objective = build_objective(cfg.objective, cfg.dim, nesting=nesting, distributed=False, pairs=False, **objective_coefficients(cfg))
    optimizer = torch.optim.Adam(encoder.parameters(), lr=cfg.lr)
    stream = PairStream(kernel, cfg, generator(cfg.seed, STREAM_TRAIN))
    tail_start = cfg.steps - round(cfg.rr_tail * cfg.steps)

    history, skipped, start = [], 0, time.perf_counter()
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(cfg, step)
        a, a_pos = stream.next()
        z1, z2 = encoder(torch.cat([a, a_pos])).chunk(2)  # one forward for both views
        loss, terms = objective(z1, z2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(encoder.parameters(), float("inf"))
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):  # never apply a non-finite step
            skipped += 1
            if skipped > MAX_SKIPPED_STEPS:
                raise FloatingPointError(f"non-finite loss or gradient in {skipped} consecutive steps (last at step {step}); lower lr")
            continue
        skipped = 0
        optimizer.step()
        if tail_accumulator is not None and step >= tail_start:
            tail_accumulator.update(z1.detach().double(), z2.detach().double())
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            elapsed = time.perf_counter() - start
            record = {
                "step": step + 1,
                "loss": loss.item(),
                "lr": optimizer.param_groups[0]["lr"],
                "eigenvalues": [round(v, 5) for v in terms["eigenvalues"].tolist()],
                "seconds": round(elapsed, 1),
            }
            history.append(record)
            print(
                f"step {step + 1}/{cfg.steps} loss {record['loss']:.5f} lr {record['lr']:.2e} "
                f"eig {record['eigenvalues']} {(step + 1) / elapsed:.0f} steps/s",
                file=sys.stderr,
                flush=True,
            )
    return encoder, history
