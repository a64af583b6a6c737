"""constant_mode='fixed' (LoRA/SCL): the constant function held outside the nested prefixes (issue 22 item 2).

Every prefix loss is the loss of [1, f_1..f_k]; the features f themselves are driven to mean zero."""

import pytest
import torch
import torch.nn.functional as F

from eigtrain.evaluate.probes import constant_share
from eigtrain.export.embed import embed_split, open_run
from eigtrain.objectives import build_objective
from eigtrain.train.command import compose_config, run

# A positive-pair kernel on 4 points with uniform marginals: k = P+/(p p) = 1 + sum_i lam_i psi_i psi_i^T with
# psi_i the Walsh functions (mean zero, unit mean square): its top eigenfunction is the constant, eigenvalue 1.
WALSH = torch.tensor([[1, 1, -1, -1], [1, -1, 1, -1], [1, -1, -1, 1]], dtype=torch.float64).T
LAM = torch.tensor([0.5, 0.25, 0.1], dtype=torch.float64)
CONDITIONAL_CDF = ((1 + WALSH @ torch.diag(LAM) @ WALSH.T) / 4).cumsum(1)  # of P+(a | x)


def _lora_of(f, g):
    """The LoRA loss of one prefix, with its O(m^2) pair matrix (no moments, no masks)."""
    s = f @ g.T
    off_diagonal = s.pow(2).sum() - s.diagonal().pow(2).sum()
    return -2.0 * s.diagonal().mean() + off_diagonal / (len(f) * (len(f) - 1))


@pytest.mark.parametrize("normalize", ["none", "full", "prefix"])
@pytest.mark.parametrize("nesting", ["none", "joint"])
def test_masked_loss_is_the_loss_of_the_constant_and_each_prefix(normalize, nesting):
    gen = torch.Generator().manual_seed(0)
    f = torch.randn(12, 5, generator=gen, dtype=torch.float64) + 0.7
    g = torch.randn(12, 5, generator=gen, dtype=torch.float64) + 0.3
    ones = torch.ones(12, 1, dtype=torch.float64)

    def with_constant(z, k):  # the constant is appended after the normalization, never normalized with f
        z = {"full": F.normalize(z, dim=1)[:, :k], "prefix": F.normalize(z[:, :k], dim=1)}.get(normalize, z[:, :k])
        return torch.cat([ones, z], 1)

    prefixes = range(1, 6) if nesting == "joint" else [5]
    want = sum(_lora_of(with_constant(f, k), with_constant(g, k)) for k in prefixes) / len(prefixes)
    objective = build_objective(
        "scl", 5, nesting=nesting, normalize=normalize, constant_mode="fixed", distributed=False
    )
    loss, terms = objective(f, g)
    torch.testing.assert_close(loss, want, rtol=0, atol=1e-12)
    assert "constant" in terms


def test_two_encoders_hold_one_constant_on_each_side():
    gen = torch.Generator().manual_seed(1)
    f, g = (
        torch.randn(10, 3, generator=gen, dtype=torch.float64) + 1,
        torch.randn(10, 3, generator=gen, dtype=torch.float64),
    )
    ones = torch.ones(10, 1, dtype=torch.float64)
    loss, _ = build_objective("lora", 3, constant_mode="fixed", distributed=False)(f, g)
    torch.testing.assert_close(loss, _lora_of(torch.cat([ones, f], 1), torch.cat([ones, g], 1)), rtol=0, atol=1e-12)


def _train_table(constant_mode: str, dim: int = 2, steps: int = 300, batch: int = 512) -> torch.Tensor:
    """Minimise joint-nested SCL (normalize=none: LoRA's form) over free features f(x), x in 4 points, on
    pairs drawn from the Walsh kernel; returns f as a (4, dim) table."""
    torch.manual_seed(0)
    table = torch.nn.Parameter(0.1 * torch.randn(4, dim, dtype=torch.float64) + 0.5)
    objective = build_objective(
        "scl", dim, nesting="joint", normalize="none", constant_mode=constant_mode, distributed=False
    )
    opt = torch.optim.Adam([table], lr=0.05)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)  # decays the sampling noise away
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randint(4, (batch,), generator=gen)
        u = torch.rand(batch, 1, generator=gen, dtype=torch.float64)
        a = torch.searchsorted(CONDITIONAL_CDF[x], u)[:, 0].clamp_max(3)
        loss, _ = objective(table[x], table[a])
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    return table.detach()


def _constant_share(f: torch.Tensor) -> torch.Tensor:  # E[f_i]^2 / E[f_i^2] under the uniform marginal
    return f.mean(0).pow(2) / f.pow(2).mean(0)


def test_the_minimiser_with_the_constant_held_outside_is_the_mean_zero_eigenfunctions():
    f = _train_table("fixed")
    assert _constant_share(f).max() < 1e-3, _constant_share(f)
    # Exactly the nested minimiser of the kernel without its constant: f_i = +-sqrt(lam_i) psi_i, in order.
    for i in range(2):
        want = LAM[i].sqrt() * WALSH[:, i]
        assert min((f[:, i] - want).abs().max(), (f[:, i] + want).abs().max()) < 0.05, (i, f[:, i], want)


def test_without_it_the_first_prefix_learns_the_constant():
    # What the option removes: the top eigenfunction is the constant, so the first nested coordinate fits it.
    assert _constant_share(_train_table("none"))[0] > 0.99


@pytest.mark.parametrize(
    "coefficients, message",
    [
        ({"constant_mode": "learned"}, "constant_mode='learned' is unknown; allowed: none, fixed"),
        ({"center": True}, "constant_mode='fixed' \\(the default\\) cannot be combined with center=true"),
    ],
)
def test_bad_constant_mode_is_one_clear_error(coefficients, message):
    with pytest.raises(ValueError, match=message):
        build_objective("scl", 4, nesting="joint", **coefficients)


@pytest.mark.slow  # ~25 s on 2 shared cores
def test_quickstart_training_with_the_constant_held_outside_leaves_the_first_coordinates_mean_zero(
    digits_root, tmp_path
):
    # The quickstart's recipe (tiny CNN, SCL normalize=full, joint nesting over every prefix, dim 32), shortened to
    # 60 steps of 64, with its defaults (constant_mode=fixed). With constant_mode=none this run's coordinates 1-4 hold
    # constant shares 0.09, 0.68, 0.26, 0.00 (the constant spread over the first prefixes; benchmarks/jn_constant.md);
    # with the constant held outside, each stays below 0.03.
    run(
        compose_config(
            [
                "experiment=quickstart",
                f"run_dir={tmp_path / 'run'}",
                f"data.root={digits_root}",
                "steps=60",
                "batch_size=64",
                "checkpoint_every=60",
                "cpu_threads=1",
                "logging.progress=false",
                "logging.wandb.mode=disabled",
            ]
        )
    )
    z, _ = embed_split(open_run(str(tmp_path / "run")), "val")
    shares = constant_share(z[:, :4])
    assert max(shares) < 0.1, shares
