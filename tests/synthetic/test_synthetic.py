"""Synthetic kernels (eigtrain.synthetic): kernels, exact sampler, metrics, config, a short training run."""

import json

import numpy as np
import pytest
import torch

from eigtrain.synthetic.cli import main
from eigtrain.synthetic.config import parse_run_args
from eigtrain.synthetic.kernels import build_kernel, paper_eigenvalues, sup_squared
from eigtrain.synthetic.metrics import ef_mse_per_function, ev_rae_per_function
from eigtrain.synthetic.run import run
from eigtrain.synthetic.sampler import sample_pairs


@pytest.mark.parametrize("name", ["legendre", "fourier", "fourier_sum"])
def test_eigenfunctions_are_orthonormal(name):
    # Gauss-Legendre quadrature (64 nodes per axis) integrates these polynomials / cosines to ~1e-12.
    kernel = build_kernel(name, 10)
    x, w = np.polynomial.legendre.leggauss(64)
    grids = np.meshgrid(*[x] * kernel.input_dim, indexing="ij")
    weights = np.prod(np.meshgrid(*[w / 2] * kernel.input_dim, indexing="ij"), axis=0).ravel()
    a = torch.tensor(np.stack([g.ravel() for g in grids], 1))
    psi = kernel.eigenfunctions(a)
    gram = psi.T @ (psi * torch.tensor(weights)[:, None])
    torch.testing.assert_close(gram, torch.eye(10, dtype=torch.float64), atol=1e-10, rtol=0)
    assert torch.all(psi[:, 0] == 1)  # the constant mode is exactly 1


@pytest.mark.parametrize("name", ["legendre", "fourier", "fourier_sum"])
def test_sampler_marginals_uniform_and_moments_diagonal(name):
    """Marginals uniform; E[psi_i(a) psi_j(a')] = lambda_i delta_ij within 5 standard errors."""
    kernel = build_kernel(name, 8)
    n = 200_000
    a, a_pos = sample_pairs(kernel, n, torch.Generator().manual_seed(0), dtype=torch.float64)
    for view in (a, a_pos):
        assert view.shape == (n, kernel.input_dim) and view.min() >= -1 and view.max() <= 1
        for j in range(kernel.input_dim):
            counts = torch.histc(view[:, j], bins=20, min=-1, max=1)
            # 10^4 expected per bin, binomial sd ~ 97: 5% is over 5 sd.
            assert (counts / (n / 20) - 1).abs().max() < 0.05
    products = kernel.eigenfunctions(a)[:, :, None] * kernel.eigenfunctions(a_pos)[:, None, :]
    moments, se = products.mean(0), products.std(0) / n**0.5
    error = (moments - torch.diag(kernel.eigenvalues)).abs()
    assert torch.all(error < 5 * se + 1e-12), (error / se).max()
    assert error.max() < 0.02


def test_sampler_is_reproducible():
    kernel = build_kernel("legendre", 6)
    first = sample_pairs(kernel, 1000, torch.Generator().manual_seed(3))
    second = sample_pairs(kernel, 1000, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(first, second))


@pytest.mark.parametrize("name,p", [("legendre", 1), ("fourier", 2), ("legendre", 2), ("fourier_sum", 2)])
@pytest.mark.parametrize("rank", [6, 8, 10])
def test_paper_eigenvalues_meet_the_validity_condition_with_equality(name, p, rank):
    lam = paper_eigenvalues(name, rank, p)
    assert lam[0] == 1 and torch.all(lam[1:].diff() < 0)
    assert float((lam[1:] * sup_squared(name, rank, p)[1:]).sum()) == pytest.approx(1.0, abs=1e-12)
    kernel = build_kernel(name, rank, p)
    # The condition guarantees k >= 0, hence P+ >= 0, everywhere; check on random points.
    x = torch.rand(20_000, p, dtype=torch.float64) * 2 - 1
    y = torch.rand(20_000, p, dtype=torch.float64) * 2 - 1
    assert kernel.kernel(x, y).min() >= -1e-12
    assert kernel.kernel_bound() == pytest.approx(2.0)


def test_validity_condition_violation_raises():
    lam = paper_eigenvalues("legendre", 8, 1)
    too_big = torch.cat([lam[:1], lam[1:] * 1.01])
    with pytest.raises(ValueError, match="validity condition"):
        build_kernel("legendre", 8, eigenvalues=too_big)
    with pytest.raises(ValueError, match="constant mode must be 1"):
        build_kernel("fourier", 4, eigenvalues=[0.9, 0.1, 0.05, 0.01])
    with pytest.raises(ValueError, match="kernel='gauss'"):
        build_kernel("gauss", 8)


def test_metrics_zero_for_perfect_estimate_and_sign_flips():
    kernel = build_kernel("legendre", 8)
    a = torch.rand(10_000, 1, dtype=torch.float64) * 2 - 1
    psi = kernel.eigenfunctions(a)[:, :4]
    flips = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    assert ef_mse_per_function(psi, psi * flips).abs().max() == 0
    lam = kernel.eigenvalues[:4]
    assert ev_rae_per_function(lam, lam.clone()).abs().max() == 0
    # Known values: swapping two orthonormal functions costs E(psi_2 - psi_3)^2 = 2 each.
    swapped = psi[:, [0, 2, 1, 3]]
    per = ef_mse_per_function(psi, swapped)
    assert per[0] == 0 and per[3] == 0 and per[1:3].sub(2).abs().max() < 0.1
    assert ev_rae_per_function(lam, 1.1 * lam).sub(0.1).abs().max() < 1e-12


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        parse_run_args(["stepz=10"])
    with pytest.raises(ValueError, match="bad value for steps: Value 'ten'"):
        parse_run_args(["steps=ten"])
    with pytest.raises(ValueError, match="objective='simclr'"):
        parse_run_args(["objective=simclr"]).validate()
    with pytest.raises(ValueError, match="rank=7"):
        parse_run_args(["rank=7"]).validate()
    with pytest.raises(ValueError, match="adam_beta2=1.0"):
        parse_run_args(["adam_beta2=1"]).validate()
    assert main(["kernel=bessel"]) == 2
    paper = parse_run_args(["preset=paper", "seed=4"])
    assert (paper.steps, paper.train_samples, paper.schedule, paper.seed) == (300_000, 10_000_000, "constant", 4)
    assert parse_run_args(["steps=3e4", "preset=paper"]).steps == 30_000  # explicit keys win


def test_cli_writes_json_grid_and_table(tmp_path):
    tiny = ["steps=20", "rr_samples=4000", "eval_samples=4000", "log_every=10"]
    out = tmp_path / "run.json"
    assert main(["kernel=fourier", "objective=rq", "extraction=rr", "rr_tail=0.5", f"out={out}", "rank=6", *tiny]) == 0
    result = json.loads(out.read_text())
    assert result["rr_pairs"] == 4000 + 10 * 1000  # fresh pairs + the last half of the training batches
    for key in ("ef_mse", "ev_rae", "ef_mse_per_function", "ev_rae_per_function", "config", "extractions"):
        assert key in result
    assert len(result["ef_mse_per_function"]) == 3 and result["config"]["kernel"] == "fourier"
    assert set(result["extractions"]) == {"ordered_paper", "ordered", "ordered_gs", "rr_generalized", "rr_paper"}

    small = ["steps=4", "batch_size=100", "width=8", "depth=1", "eval_samples=2000", "log_every=10"]
    for recipe in ("paper", "eigtrain"):
        extra = ["train_samples=200"] if recipe == "paper" else ["rr_samples=2000"]
        args = [
            "grid",
            f"recipe={recipe}",
            "kernels=legendre",
            "ranks=6",
            "seeds=0,1",
            f"dir={tmp_path / recipe}",
            *small,
            *extra,
        ]
        assert main(args) == 0
    cell = json.loads((tmp_path / "paper" / "legendre_r6.json").read_text())
    assert cell["config"]["jn_readoff"] == "paper" and cell["config"]["rr_mode"] == "paper"
    assert (
        cell["methods"]["lora-jn"]["extraction"] == "ordered_paper"
        and cell["methods"]["rq-rr"]["extraction"] == "rr_paper"
    )
    assert cell["methods"]["vicreg-rr"]["objective"] == "vicreg_paper"
    assert cell["methods"]["lora-rr"]["rr_pairs"] == [200, 200]  # the whole (reused) training pool
    assert len(cell["methods"]["rq-jn"]["ef_mse"]) == 2
    table = tmp_path / "table.md"
    assert main(["table", "ranks=6", "kernels=legendre", f"dir={tmp_path}", f"out={table}"]) == 0
    text = table.read_text()
    assert "LoRA-JN" in text and "0.068 ± 0.015" in text  # the paper's Legendre r=6 LoRA-JN
    assert "paper recipe" in text and "eigtrain recipe" in text and "of 6**" in text
    assert (
        main(["table", "ranks=6", "kernels=legendre", f"dir={tmp_path}", f"out={table}", "recipes=paper,never_run"])
        == 0
    )
    assert "never_run recipe" not in table.read_text()  # a recipe without this cell gets no row of dashes
    assert (
        main(
            [
                "table",
                "ranks=6",
                "kernels=legendre",
                f"dir={tmp_path}",
                f"out={table}",
                "recipes=paper",
                "union=eigtrain",
            ]
        )
        == 0
    )
    union, values = table.read_text().split("with any of eigtrain: **")[1].split("The same budgets' values")
    assert union.startswith(("0 of 6**", "1 of 6**")) and union.count("| no") + union.count("| yes (eigtrain)") == 6
    rows = [line for line in values.splitlines() if line.startswith("| Legendre r=6 `eigtrain` |")]
    assert len(rows) == 1 and rows[0].count(" / ") == 6 and rows[0].count("**") == 2 * union.count("| yes (eigtrain)")
    assert "| the paper | 0.111 / 0.045 | 0.068 / 0.049 |" in values  # Legendre r=6 LoRA-RR, LoRA-JN


def test_presets_are_the_recipes():
    paper = parse_run_args(["preset=paper"]).validate()
    assert (paper.constant_mode, paper.schedule, paper.lr, paper.fourier_features) == (
        "learned",
        "constant",
        1e-3,
        "paper",
    )
    assert (paper.train_samples, paper.extraction_pairs, paper.rr_mode, paper.jn_readoff) == (
        10_000_000,
        "train",
        "paper",
        "paper",
    )
    ours = parse_run_args(["preset=eigtrain"]).validate()
    assert (ours.constant_mode, ours.schedule, ours.rr_mode, ours.jn_readoff, ours.steps) == (
        "learned",
        "cosine",
        "generalized",
        "gs",
        30_000,
    )
    assert (ours.adam_beta2, ours.lr, paper.adam_beta2) == (0.99, 3e-3, 0.999)
    with pytest.raises(ValueError, match="extraction_pairs=train needs a training pool"):
        parse_run_args(["extraction_pairs=train"]).validate()


@pytest.mark.slow
def test_short_training_recovers_eigenfunctions():
    """LoRA (SCL) + Rayleigh-Ritz on Legendre r = 6 in 400 steps: EF-MSE < 0.11 and EV-RAE < 0.1
    (the paper, 3e5 steps: 0.111 and 0.045; seeds 0 and 1 measured 0.056 / 0.033 and 0.029 / 0.030)."""
    overrides = ["rank=6", "extraction=rr", "steps=400", "rr_samples=100000", "eval_samples=100000", "log_every=400"]
    result = run(parse_run_args(overrides))
    assert result["ef_mse"] < 0.11, result["ef_mse_per_function"]
    assert result["ev_rae"] < 0.1, result["ev_rae_per_function"]


class _ExactFeatures(torch.nn.Module):
    """A stand-in encoder whose features are exact eigenfunctions psi_(first+1)..psi_(first+d), scaled and
    shifted (a mean-invariant objective such as VICReg leaves the shift arbitrary)."""

    def __init__(self, kernel, first, d, scale, shift):
        super().__init__()
        self.kernel, self.first, self.d, self.scale, self.shift = kernel, first, d, scale, shift

    def forward(self, a):
        psi = self.kernel.eigenfunctions(a.double())[:, self.first : self.first + self.d]
        return (psi * self.scale + self.shift).float()


def test_vicreg_is_compared_with_the_centered_kernels_eigenpairs():
    """VICReg's features are centered (its loss and the paper's F.2): they estimate psi_2..psi_(d+1), and
    every extraction of a VICReg run centers them, so its numbers do not depend on the arbitrary offsets."""
    from eigtrain.export.moments import RRAccumulator
    from eigtrain.synthetic.extract import accumulate_pairs, evaluate, extract_all, target_first

    kernel, d = build_kernel("legendre", 8), 4
    assert target_first("vicreg_paper") == target_first("vicreg") == 1 and target_first("rq") == 0
    scale = torch.tensor([2.0, 0.5, 1.0, 3.0])
    outs = []
    for shift in (torch.zeros(d), torch.tensor([3.0, -2.0, 0.5, 7.0])):
        encoder = _ExactFeatures(kernel, 1, d, scale, shift)
        acc = accumulate_pairs(encoder, kernel, 200_000, torch.Generator().manual_seed(0), RRAccumulator(d))
        outs.append(
            evaluate(
                encoder, kernel, extract_all(acc, "vicreg_paper"), 50_000, torch.Generator().manual_seed(1), first=1
            )
        )
    plain, shifted = outs
    for name in ("ordered_paper", "ordered", "ordered_gs", "rr_generalized", "rr_paper"):
        for metric in ("ef_mse", "ev_rae"):
            assert shifted[name][metric] == pytest.approx(plain[name][metric], abs=1e-4), (name, metric)
    for name in ("ordered_paper", "ordered", "ordered_gs"):  # no mixing: exact up to the evaluation sample
        assert shifted[name]["ef_mse"] < 1e-3, (name, shifted[name]["ef_mse_per_function"])
    # Rayleigh quotients (1e5-pair noise ~10 % at lambda_5 = 0.018); the plain read-off's E[f(a) f(a+)]
    # assumes a unit-norm minimizer, so it reads scale^2 lambda
    assert shifted["ordered"]["ev_rae"] < 0.3
    read = torch.tensor(shifted["ordered_paper"]["eigenvalues"]) / scale.double() ** 2
    assert read.div(kernel.eigenvalues[1 : d + 1]).sub(1).abs().max() < 0.3  # scale^2 itself is 0.25..9
    # the same features judged against psi_1..psi_d (the old reading) cannot score: psi_1 = 1 has no
    # centered estimate, E(1 - f)^2 = 2 for any zero-mean unit-norm f
    encoder = _ExactFeatures(kernel, 1, d, scale, torch.zeros(d))
    acc = accumulate_pairs(encoder, kernel, 20_000, torch.Generator().manual_seed(0), RRAccumulator(d))
    old = evaluate(encoder, kernel, extract_all(acc, "vicreg_paper"), 50_000, torch.Generator().manual_seed(1), first=0)
    assert old["ordered_gs"]["ef_mse_per_function"][0] == pytest.approx(2.0, abs=1e-2)
    with pytest.raises(ValueError, match="rank-8 kernel"):
        evaluate(encoder, kernel, extract_all(acc, "vicreg_paper"), 100, torch.Generator().manual_seed(1), first=5)
    with pytest.raises(ValueError, match="constant_mode=fixed with objective=vicreg_paper"):
        parse_run_args(["objective=vicreg_paper"]).validate()


def test_grid_fills_a_cell_a_few_methods_at_a_time(tmp_path):
    """A cell file gains methods run later with the same config and seeds (stored ones are not retrained);
    a superseded VICReg record is retrained; another config retrains the whole cell."""
    small = [
        "recipe=eigtrain",
        "kernels=legendre",
        "ranks=6",
        "seeds=0",
        f"dir={tmp_path}",
        "steps=4",
        "batch_size=100",
        "width=8",
        "depth=1",
        "rr_samples=2000",
        "eval_samples=2000",
        "log_every=2",
    ]
    path = tmp_path / "legendre_r6.json"
    assert main(["grid", "methods=lora-jn", *small]) == 0
    first = json.loads(path.read_text())
    assert main(["grid", "methods=rq-rr,vicreg-rr", *small[:-1], "log_every=4"]) == 0  # log_every changes no result
    cell = json.loads(path.read_text())
    assert list(cell["methods"]) == ["lora-jn", "rq-rr", "vicreg-rr"]
    assert cell["methods"]["lora-jn"] == first["methods"]["lora-jn"]
    vicreg = cell["methods"]["vicreg-rr"]
    lam = build_kernel("legendre", 6).eigenvalues
    assert vicreg["target_first"] == 1 and vicreg["eigenvalues_true"] == pytest.approx(lam[1:4].tolist(), abs=1e-5)
    assert (
        main(["grid", "methods=vicreg-jn", *small, f"dir={tmp_path / 'vicreg_only'}"]) == 0
    )  # the cell's truth stays psi_1..psi_d
    only = json.loads((tmp_path / "vicreg_only" / "legendre_r6.json").read_text())
    assert only["eigenvalues_true"] == pytest.approx(lam[:3].tolist(), abs=1e-5) and only["curve_true"][0][0] == 1.0
    # a VICReg result stored without its target (compared with psi_1..psi_d) is superseded: retrained
    want = list(vicreg["ef_mse"])
    del cell["methods"]["vicreg-rr"]["target_first"]
    cell["methods"]["vicreg-rr"]["ef_mse"] = [9.0]
    path.write_text(json.dumps(cell))
    assert main(["grid", "methods=lora-jn,vicreg-rr", *small]) == 0
    again = json.loads(path.read_text())
    assert again["methods"]["vicreg-rr"]["ef_mse"] == pytest.approx(want, rel=1e-3) and "rq-rr" in again["methods"]
    assert main(["grid", "methods=lora-jn", *small, "lr=2e-3"]) == 0  # another config: the cell is replaced
    assert list(json.loads(path.read_text())["methods"]) == ["lora-jn"]
