"""Retrieval metrics against a brute-force numpy reference (torch and FAISS backends), the PCA baseline against
numpy's SVD, and the smallest-k summary."""

import numpy as np
import pytest
import torch

from eigtrain.evaluate.probes import fit_pca, pca_features, smallest_k_within
from eigtrain.evaluate.retrieval import (
    bytes_per_vector,
    resolve_backend,
    retrieval_metrics,
    search,
    search_seconds_per_query,
)


def _labelled(n_train=300, n_test=120, d=12, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d))
    ytr, yte = rng.integers(0, classes, n_train), rng.integers(0, classes, n_test)
    xtr = centers[ytr] + 1.2 * rng.normal(size=(n_train, d))
    xte = centers[yte] + 1.2 * rng.normal(size=(n_test, d))
    return xtr, ytr, xte, yte


def _numpy_reference(xtr, ytr, xte, yte, ks=(1, 10)):
    """Cosine similarity in float64, full argsort: the definition, written out."""
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    a, b = unit(xtr), unit(xte)
    nearest = np.argmax(b @ a.T, axis=1)
    out = {"1nn": float(np.mean(ytr[nearest] == yte))}
    sims = b @ b.T
    np.fill_diagonal(sims, -np.inf)
    order = np.argsort(-sims, axis=1)
    for k in ks:
        out[f"hit@{k}"] = float(np.mean([(yte[order[i, :k]] == yte[i]).any() for i in range(len(yte))]))
    return out


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_retrieval_metrics_equal_brute_force_numpy(backend):
    if backend == "faiss":
        pytest.importorskip("faiss")
    xtr, ytr, xte, yte = _labelled()
    reference = _numpy_reference(xtr, ytr, xte, yte)
    for k in (2, 5, 12):  # prefixes, as the report uses them
        got = retrieval_metrics(
            torch.from_numpy(xtr[:, :k]),
            torch.from_numpy(ytr),
            torch.from_numpy(xte[:, :k]),
            torch.from_numpy(yte),
            backend=backend,
        )
        want = _numpy_reference(xtr[:, :k], ytr, xte[:, :k], yte)
        assert got == pytest.approx(want, abs=1e-12), (k, got, want)
    assert 0.3 < reference["1nn"] < 1.0 and reference["hit@10"] > reference["hit@1"]  # not a trivial case


def test_faiss_and_torch_return_the_same_neighbours():
    pytest.importorskip("faiss")
    xtr, _, xte, _ = _labelled()
    db, q = torch.from_numpy(xtr), torch.from_numpy(xte)
    assert torch.equal(search(db, q, 10, "torch"), search(db, q, 10, "faiss"))
    assert torch.equal(search(q, q, 10, "torch", exclude_self=True), search(q, q, 10, "faiss", exclude_self=True))
    assert resolve_backend("auto") == "torch"  # exact search: torch is as fast or faster (retrieval's docstring)


def test_leave_one_out_never_returns_the_query_even_with_duplicates():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    for backend in ("torch", "faiss") if _has_faiss() else ("torch",):
        found = search(x, x, 2, backend, exclude_self=True)
        assert all(i not in row for i, row in enumerate(found.tolist())), (backend, found)
        assert found[0, 0] == 1 and found[1, 0] == 0  # the duplicate is the nearest other vector


def _has_faiss():
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def test_storage_and_timing():
    assert bytes_per_vector(16) == {"fp32": 64, "fp16": 32, "int8": 16}
    xtr, _, xte, _ = _labelled()
    seconds = search_seconds_per_query(torch.from_numpy(xtr), torch.from_numpy(xte), 10, "torch")
    assert 0 < seconds < 0.01
    with pytest.raises(ValueError, match="backend='annoy' is unknown"):
        resolve_backend("annoy")


def test_pca_baseline_equals_numpy_svd():
    rng = np.random.default_rng(3)
    x = (
        rng.normal(size=(500, 8)) @ np.diag([5, 4, 3, 2.5, 2, 1.5, 1, 0.5]) @ np.linalg.qr(rng.normal(size=(8, 8)))[0]
        + 2.0
    )
    test = rng.normal(size=(50, 8))
    mean, components, variances = fit_pca(torch.from_numpy(x))
    centered = x - x.mean(0)
    _, s, vt = np.linalg.svd(centered, full_matrices=False)
    np.testing.assert_allclose(variances.numpy(), s**2 / (len(x) - 1), rtol=1e-10)
    signs = np.sign(np.sum(components.numpy() * vt.T, axis=0))
    np.testing.assert_allclose(components.numpy() * signs, vt.T, atol=1e-10)
    train_p, test_p = pca_features(torch.from_numpy(x), torch.from_numpy(test))
    np.testing.assert_allclose(train_p.numpy() * signs, centered @ vt.T, atol=1e-5)  # float32 features
    np.testing.assert_allclose(test_p.numpy() * signs, (test - x.mean(0)) @ vt.T, atol=1e-5)


def test_smallest_k_within_points_of_full_dimension():
    row = {4: 0.80, 8: 0.905, 16: 0.94, 32: 0.95}
    assert smallest_k_within(row, 1) == 16 and smallest_k_within(row, 5) == 8 and smallest_k_within(row, 20) == 4
    assert smallest_k_within({}, 1) is None


def test_blocked_search_equals_one_block():
    xtr, _, xte, _ = _labelled()
    db, q = torch.from_numpy(xtr), torch.from_numpy(xte)
    for exclude_self, database in ((False, db), (True, q)):  # a block of 1 query, then 2 at a time
        whole = search(database, q, 10, "torch", exclude_self=exclude_self)
        for elements in (len(database), 2 * len(database) + 1):
            assert torch.equal(
                search(database, q, 10, "torch", exclude_self=exclude_self, block_elements=elements), whole
            )
