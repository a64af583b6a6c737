"""The batched ensemble trains each member exactly as a single run of its config would."""

import dataclasses

import pytest
import torch

from eigtrain.synthetic.config import parse_run_args
from eigtrain.synthetic.kernels import build_kernel
from eigtrain.synthetic.run import run, run_ensemble
from eigtrain.synthetic.train import train, train_single


def _cfgs(kernel="legendre", **extra):
    base = parse_run_args(
        [
            "rank=6",
            "width=16",
            "depth=2",
            "batch_size=64",
            "steps=15",
            "lr=3e-3",
            "constant_mode=learned",
            "log_every=15",
            f"kernel={kernel}",
        ]
    )
    base = dataclasses.replace(base, **extra)
    members = [("scl", "joint", 0), ("rq", "rr", 1), ("vicreg_paper", "joint", 2), ("scl", "rr", 1)]
    return [dataclasses.replace(base, objective=o, extraction=e, seed=s) for o, e, s in members]


@pytest.mark.parametrize(
    "kernel, extra",
    [
        ("legendre", {}),
        ("legendre", {"adam_beta1": 0.8, "adam_beta2": 0.95}),
        ("fourier", {"train_samples": 640, "schedule": "constant"}),
    ],
)
def test_ensemble_member_equals_single_run(kernel, extra):
    cfgs = _cfgs(kernel, **extra)
    kernel = build_kernel(cfgs[0].kernel, cfgs[0].rank)
    ensemble, _, _ = train(cfgs, kernel)
    a = torch.rand(500, kernel.input_dim) * 2 - 1
    for m, cfg in enumerate(cfgs):
        single = train_single(cfg, kernel)
        with torch.no_grad():
            want, got = single(a), ensemble.member(m)(a)
        if cfg.objective == "vicreg_paper":
            # VICReg ignores the feature means: the output bias's gradient is rounding noise, which Adam
            # scales to +-lr, so only the centered functions are determined.
            want, got = want - want.mean(0), got - got.mean(0)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        # and the members really differ (no shared state): other seeds/objectives give other functions
        if m:
            assert (got - ensemble.member(0)(a)).abs().max() > 1e-2


def test_run_ensemble_equals_separate_runs_and_paper_extraction_on_training_pairs():
    cfgs = [dataclasses.replace(c, rr_samples=2000, eval_samples=2000) for c in _cfgs()[:2]]
    together = run_ensemble(cfgs)
    for cfg, result in zip(cfgs, together):
        alone = run(cfg)
        assert result["ef_mse"] == pytest.approx(alone["ef_mse"], rel=1e-3, abs=1e-6)
        assert result["ev_rae"] == pytest.approx(alone["ev_rae"], rel=1e-3, abs=1e-6)
    paper = dataclasses.replace(
        cfgs[0], preset="paper", train_samples=640, extraction_pairs="train", jn_readoff="paper", rr_mode="paper"
    )
    result = run(paper)
    # 15 steps of 64 on a pool of 640: the pool is reused after 10 steps, and extraction sees all of it
    assert result["rr_pairs"] == 640 and result["extraction"] == "ordered_paper"
