"""Diagnostic (benchmarks/synthetic.md, "Why learning the constant hurt"): per layer, the RMS of the current weight
gradient vs Adam's bias-corrected sqrt(v), and each output coordinate's mean and std over inputs, every 150 steps.

  OMP_NUM_THREADS=1 python benchmarks/synthetic/probes/adam_diagnostic.py objective=scl extraction=rr constant_mode=learned adam_beta2=0.999|0.99
"""

import sys

import torch

from eigtrain.objectives import build_objective
from eigtrain.synthetic.config import parse_run_args
from eigtrain.synthetic.kernels import build_kernel
from eigtrain.synthetic.train import (
    STREAM_TRAIN,
    PairStream,
    build_encoder,
    generator,
    learning_rate,
    objective_coefficients,
)

torch.set_num_threads(1)
keys = {"preset": "eigtrain", "rank": 8, "lr": 3e-3, "steps": 1500, **dict(a.split("=", 1) for a in sys.argv[1:])}
cfg = parse_run_args([f"{k}={v}" for k, v in keys.items()]).validate()
kernel = build_kernel(cfg.kernel, cfg.rank)
enc = build_encoder(cfg, kernel)
obj = build_objective(
    cfg.objective,
    cfg.dim,
    nesting="joint" if cfg.extraction == "joint" else "none",
    distributed=False,
    pairs=False,
    **objective_coefficients(cfg),
)
opt = torch.optim.Adam(enc.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2))
stream = PairStream(kernel, cfg, generator(cfg.seed, STREAM_TRAIN))
ev = torch.rand(5000, kernel.input_dim, generator=torch.Generator().manual_seed(9)) * 2 - 1
lin = [m for m in enc.mlp if isinstance(m, torch.nn.Linear)]
for step in range(cfg.steps):
    for g in opt.param_groups:
        g["lr"] = learning_rate(cfg, step)
    a, ap = stream.next()
    z1, z2 = enc(torch.cat([a, ap])).chunk(2)
    loss, _ = obj(z1, z2)
    opt.zero_grad()
    loss.backward()
    if step % 150 == 0 or step == cfg.steps - 1:
        rows = []
        for layer in lin:
            g = layer.weight.grad
            st = opt.state.get(layer.weight)
            vs = (st["exp_avg_sq"] / (1 - cfg.adam_beta2 ** st["step"])).sqrt().mean().item() if st else float("nan")
            rows.append(f"{g.pow(2).mean().sqrt().item():.1e}/{vs:.1e}")
        with torch.no_grad():
            f = enc(ev).double()
        fm, fs = f.mean(0), f.std(0)
        print(
            f"step {step} loss {loss.item():.4f} grad/sqrt(v) per layer {' '.join(rows)} | f mean {' '.join(f'{x:.2f}' for x in fm.tolist())} std {' '.join(f'{x:.2f}' for x in fs.tolist())}",
            flush=True,
        )
    opt.step()
