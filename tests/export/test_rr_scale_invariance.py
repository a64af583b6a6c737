"""The export does not depend on the scales of the coordinates (issue 54, item 1): one coordinate of a
well-conditioned embedding multiplied by 1e5 or 1e6, in float32 and float64 files, through `eigtrain-rr
embeddings=`: every feature is exported and its eigenvalues equal scipy's generalized eigh(K, G) on the same
moments. (Before, the rank cut and the dead test were relative to the largest coordinate: x1e5 exported 6 of 16.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg

from eigtrain.export.command import main as rr_main

D, N = 16, 20000


def pairs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two views sharing a part of each coordinate: K's eigenvalues spread over (0.05, 0.95), G about the identity."""
    rng = np.random.default_rng(seed)
    shared = np.linspace(0.95, 0.05, D)
    common = rng.standard_normal((N, D)) * np.sqrt(shared)
    own = lambda: rng.standard_normal((N, D)) * np.sqrt(1 - shared)  # noqa: E731
    offset = rng.standard_normal(D)  # a mean: the constant is excluded, not in the span
    return common + own() + offset, common + own() + offset


def scipy_eigenvalues(z1: np.ndarray, z2: np.ndarray) -> np.ndarray:
    """Descending eigenvalues of K y = lambda G y from the file's values in float64 (pooled mean, both views)."""
    z1, z2 = z1.astype(np.float64), z2.astype(np.float64)
    mean = (z1.mean(0) + z2.mean(0)) / 2
    f, g = z1 - mean, z2 - mean
    gram = (f.T @ f + g.T @ g) / 2
    cross = (f.T @ g + g.T @ f) / 2
    return scipy.linalg.eigh(cross, gram, eigvals_only=True)[::-1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("factor", [1.0, 1e5, 1e6])
def test_one_coordinate_scaled_exports_every_feature_with_scipys_eigenvalues(tmp_path, dtype, factor):
    z1, z2 = pairs()
    z1[:, 3] *= factor
    z2[:, 3] *= factor
    z1, z2 = z1.astype(dtype), z2.astype(dtype)
    np.savez(tmp_path / "pairs.npz", z1=z1, z2=z2)
    assert rr_main([f"embeddings={tmp_path / 'pairs.npz'}", f"out={tmp_path / 'rr'}"]) == 0
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    assert manifest["dimensions"] == {"dim": D, "dead": 0, "constant": 0, "dependent": 0, "features": D}
    np.testing.assert_allclose(manifest["eigenvalues"], scipy_eigenvalues(z1, z2), rtol=0, atol=1e-6)
