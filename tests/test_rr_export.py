"""eigtrain-rr on an embeddings file, the export format and its loader."""

import json

import numpy as np
import pytest
import scipy.linalg
import torch
from safetensors.torch import load_file

from eigtrain.export import load_head
from eigtrain.rr_job import main as rr_main


def _embeddings(tmp_path, n=3000, d=6, seed=0):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, d))
    mix = rng.normal(size=(d, d)) + np.eye(d) * 2
    z1 = latent @ mix + 0.3
    z2 = (0.8 * latent + 0.6 * rng.normal(size=(n, d))) @ mix + 0.3
    path = tmp_path / "emb.npz"
    np.savez(path, z1=z1, z2=z2)
    return path, z1, z2


def test_embeddings_mode_matches_scipy_generalized_eigh_and_round_trips(tmp_path):
    path, z1, z2 = _embeddings(tmp_path)
    out = tmp_path / "rr"
    assert rr_main([f"embeddings={path}", f"out={out}"]) == 0

    gram = (z1.T @ z1 + z2.T @ z2) / (2 * len(z1))
    cross = (z1.T @ z2 + z2.T @ z1) / (2 * len(z1))
    lam, vecs = scipy.linalg.eigh(cross, gram)
    lam, vecs = lam[::-1], vecs[:, ::-1]

    tensors = load_file(str(out / "rr.safetensors"))
    assert set(tensors) == {"eigenvalues", "transform", "mean"}
    np.testing.assert_allclose(tensors["eigenvalues"].numpy(), lam, rtol=1e-10, atol=1e-12)
    signs = np.sign((tensors["transform"].numpy() * vecs).sum(0))
    np.testing.assert_allclose(tensors["transform"].numpy() * signs, vecs, atol=1e-9)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n"] == 3000 and manifest["mode"] == "generalized" and manifest["dim"] == 6
    assert manifest["source"]["kind"] == "embeddings" and len(manifest["source"]["sha256"]) == 64
    assert manifest["dtype"] == "float64"
    assert (out / "eigenvalues.png").stat().st_size > 1000

    head = load_head(out, dtype=torch.float64)
    feats = head(torch.from_numpy(z1))
    # decorrelated in the right metric: unit Gram over both views, diagonal cross moment = eigenvalues
    f2 = head(torch.from_numpy(z2))
    g = (feats.T @ feats + f2.T @ f2) / (2 * len(feats))
    k = (feats.T @ f2 + f2.T @ feats) / (2 * len(feats))
    torch.testing.assert_close(g, torch.eye(6, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(k, torch.diag(tensors["eigenvalues"]), atol=1e-9, rtol=0)
    assert torch.all(tensors["eigenvalues"][:-1] >= tensors["eigenvalues"][1:])
    torch.testing.assert_close(head(torch.from_numpy(z1), k=2), feats[:, :2])


def test_svd_mode_exports_both_sides(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 4))
    path = tmp_path / "pairs.npz"
    np.savez(path, z1=x @ rng.normal(size=(4, 4)), z2=(x[:, :3] + 0.5 * rng.normal(size=(2000, 3))) @ rng.normal(size=(3, 3)))
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'rr'}", "mode=svd", "center=true"]) == 0
    right = load_head(tmp_path / "rr", side="right")
    assert right.transform.shape == (3, 3)
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'rr2'}"]) == 2  # one encoder needs equal widths
    assert "use mode=svd" in capsys.readouterr().err
    assert rr_main([f"embeddings={_embeddings(tmp_path)[0]}", f"out={tmp_path / 'rr3'}"]) == 0
    with pytest.raises(ValueError, match="no right-side tensors"):
        load_head(tmp_path / "rr3", side="right")


@pytest.mark.parametrize(
    "args, message",
    [
        (["embeddings=x.npz"], "needs out=DIR"),
        (["mode=pca", "embeddings=x.npz", "out=o"], "mode='pca' is unknown"),
        (["run_dir=a", "embeddings=b", "out=o"], "exactly one of"),
        (["colour=red", "embeddings=b", "out=o"], "colour"),
        (["embeddings=/nonexistent.npz", "out=o"], "does not exist"),
    ],
)
def test_bad_arguments_fail_with_one_clear_message(args, message, capsys):
    assert rr_main(args) == 2
    assert message in capsys.readouterr().err
