"""The Gram's shrinkage before Rayleigh-Ritz whitens by it (eigtrain.shrinkage): scikit-learn's OAS intensity."""

import numpy as np
import pytest
import torch
from sklearn.covariance import oas

from eigtrain.shrinkage import oas_intensity, shrink


def _spectrum(x: np.ndarray) -> torch.Tensor:
    return torch.linalg.eigvalsh(torch.from_numpy(x.T @ x / len(x)))


def test_the_intensity_is_scikit_learns_oas_and_fades_with_the_data():
    rng = np.random.default_rng(0)
    scales = np.geomspace(1, 0.01, 20)
    for n in (30, 300, 3000):
        x = rng.normal(size=(n, 20)) * scales
        assert oas_intensity(_spectrum(x), n) == pytest.approx(oas(x, assume_centered=True)[1], rel=1e-10)
    few, many = (oas_intensity(_spectrum(rng.normal(size=(n, 20)) * scales), n) for n in (100, 10000))
    assert many < few / 50  # ~ p / n
    assert oas_intensity(torch.full((8,), 0.5, dtype=torch.float64), 10) == 0.0  # isotropic: nothing to shrink


def test_shrink_pulls_the_spectrum_to_its_mean_and_a_hopeless_gram_all_the_way():
    evals = torch.tensor([4.0, 1.0, 0.01], dtype=torch.float64)
    shrunk, rho = shrink(evals, 50, "oas")
    assert 0 < rho < 1
    torch.testing.assert_close(shrunk, (1 - rho) * evals + rho * evals.mean())
    same, none = shrink(evals, 50, "none")
    assert torch.equal(same, evals) and none == 0.0
    flat, one = shrink(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64), 2, "oas")  # 2 samples: intensity 1
    assert one == 1.0 and torch.equal(flat, torch.full((3,), 2.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="allowed: oas, none"):
        shrink(evals, 50, "ledoit")
