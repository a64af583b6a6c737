"""eigtrain-rr on an embeddings file, the export format and its loader."""

import json

import numpy as np
import pytest
import scipy.linalg
import torch
from safetensors.torch import load_file

from eigtrain.export.command import main as rr_main
from eigtrain.export.files import load_head


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
    assert rr_main([f"embeddings={path}", f"out={out}"]) == 0  # the defaults: the exact solve

    def scipy_rr(c1, c2):
        gram = (c1.T @ c1 + c2.T @ c2) / (2 * len(c1))
        cross = (c1.T @ c2 + c2.T @ c1) / (2 * len(c1))
        lam, vecs = scipy.linalg.eigh(cross, gram)
        return lam[::-1], vecs[:, ::-1]

    tensors = load_file(str(out / "rr.safetensors"))
    assert set(tensors) == {
        "eigenvalues",
        "transform",
        "mean",
        "trivial_eigenvalue",
        "trivial_transform",
        "paper_eigenvalues",  # the paper's features: a function of the export's own tensors (raw_span.DerivedPaper)
    }
    paper = load_head(out, dtype=torch.float64, convention="paper")
    tensors.update(paper_eigenvalues=paper.eigenvalues, paper_transform=paper.transform)
    assert not paper.mean.any()
    pooled = (z1.mean(0) + z2.mean(0)) / 2  # default: the constant mode excluded, i.e. RR on centered moments
    for prefix, (lam, vecs) in (("", scipy_rr(z1 - pooled, z2 - pooled)), ("paper_", scipy_rr(z1, z2))):
        np.testing.assert_allclose(tensors[prefix + "eigenvalues"].numpy(), lam, rtol=1e-10, atol=1e-12)
        signs = np.sign((tensors[prefix + "transform"].numpy() * vecs).sum(0))
        np.testing.assert_allclose(tensors[prefix + "transform"].numpy() * signs, vecs, atol=1e-9)
    assert tensors["trivial_eigenvalue"].item() == 1.0

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


def test_a_ridge_is_a_departure_with_the_exact_spectrum_beside_it(tmp_path, capsys):
    """ridge > 0 regularizes the Gram (never the default): the manifest keeps the exact solve's spectrum beside it and
    the printout says so; the exact spectrum is scipy's generalized eigh on the sample moments."""
    path, z1, z2 = _embeddings(tmp_path, n=400, d=12)
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'rr'}", "ridge=1e-2"]) == 0
    assert "ridge=0.01 regularizes the Gram (not the exact solve)" in capsys.readouterr().out
    pooled = (z1.mean(0) + z2.mean(0)) / 2
    c1, c2 = z1 - pooled, z2 - pooled
    gram, cross = (c1.T @ c1 + c2.T @ c2) / (2 * len(c1)), (c1.T @ c2 + c2.T @ c1) / (2 * len(c1))
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    exact = scipy.linalg.eigh(cross, gram, eigvals_only=True)[::-1]
    np.testing.assert_allclose(manifest["exact_spectrum"], exact, rtol=1e-9, atol=1e-12)
    ridged = scipy.linalg.eigh(cross, gram + 1e-2 * np.trace(gram) / 12 * np.eye(12), eigvals_only=True)[::-1]
    np.testing.assert_allclose(manifest["eigenvalues"], ridged, rtol=1e-9, atol=1e-12)
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'rr2'}"]) == 0
    assert json.loads((tmp_path / "rr2" / "manifest.json").read_text())["exact_spectrum"] is None


def test_svd_mode_exports_both_sides(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 4))
    path = tmp_path / "pairs.npz"
    np.savez(
        path, z1=x @ rng.normal(size=(4, 4)), z2=(x[:, :3] + 0.5 * rng.normal(size=(2000, 3))) @ rng.normal(size=(3, 3))
    )
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


def _write_chunks(directory, z1, z2, kind):
    """The same rows as chunks of one kind: npy pairs, safetensors, npz (uneven chunk sizes)."""
    from safetensors.numpy import save_file

    directory.mkdir()
    bounds = [0, 700, 1900, 2000, len(z1)]
    for i, (s, e) in enumerate(zip(bounds, bounds[1:])):
        if kind == "npy":
            np.save(directory / f"part-{i:03d}.z1.npy", z1[s:e])
            np.save(directory / f"part-{i:03d}.z2.npy", z2[s:e])
        elif kind == "safetensors":
            save_file(
                {"z1": np.ascontiguousarray(z1[s:e]), "z2": np.ascontiguousarray(z2[s:e])},
                str(directory / f"part-{i:03d}.safetensors"),
            )
        else:
            np.savez(directory / f"part-{i:03d}.npz", z1=z1[s:e], z2=z2[s:e])
    return directory


@pytest.mark.parametrize("kind", ["npy", "safetensors", "npz", "memmap"])
def test_chunked_embeddings_equal_in_memory(tmp_path, kind):
    path, z1, z2 = _embeddings(tmp_path)
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'whole'}"]) == 0
    if kind == "memmap":  # one pair of memory-mapped arrays
        (tmp_path / "mm").mkdir()
        np.save(tmp_path / "mm" / "z1.npy", z1)
        np.save(tmp_path / "mm" / "z2.npy", z2)
        chunks = tmp_path / "mm"
    else:
        chunks = _write_chunks(tmp_path / kind, z1, z2, kind)
    assert rr_main([f"embeddings={chunks}", f"out={tmp_path / 'chunked'}"]) == 0
    whole, chunked = (load_file(str(tmp_path / d / "rr.safetensors")) for d in ("whole", "chunked"))
    for key in whole:  # the same rows merged at other block boundaries: equal up to float64 rounding
        torch.testing.assert_close(chunked[key], whole[key], rtol=0, atol=1e-10 * whole[key].abs().max().item())
    manifest = json.loads((tmp_path / "chunked" / "manifest.json").read_text())
    assert manifest["n"] == 3000 and len(manifest["source"]["sha256"]) == 64


def test_ranks_split_chunks_exactly(tmp_path):
    from eigtrain.export.command import reduce_embeddings

    _, z1, z2 = _embeddings(tmp_path)
    chunks = _write_chunks(tmp_path / "c", z1, z2, "npy")
    one, n = reduce_embeddings(str(chunks), pairs=False, block=256)
    parts = [reduce_embeddings(str(chunks), pairs=False, rank=r, world=3, block=256)[0] for r in range(3)]
    assert n == 3000 and [p.n for p in parts] == [1000, 1000, 1000]
    for p in parts[1:]:
        parts[0].merge(p)
    merged, whole = parts[0].state_dict(), one.state_dict()
    # what one encoder on two views holds (RRAccumulator): c_ff + c_gg and the symmetric part of c_fg
    for state in (merged, whole):
        state["c_ff"], state["c_fg"] = state["c_ff"] + state.pop("c_gg"), state["c_fg"] + state["c_fg"].T
    for key, value in whole.items():
        torch.testing.assert_close(merged[key], value, rtol=1e-12, atol=1e-9, msg=key)


def _bad_chunks(tmp_path, case):
    d = tmp_path / case
    d.mkdir()
    rng = np.random.default_rng(0)
    z = rng.normal(size=(50, 4))
    np.save(d / "a.z1.npy", z)
    np.save(d / "a.z2.npy", z + 0.1)
    if case == "rows":
        np.save(d / "b.z1.npy", z)
        np.save(d / "b.z2.npy", z[:40])
    elif case == "widths":
        np.save(d / "b.z1.npy", z[:, :3])
        np.save(d / "b.z2.npy", z[:, :3])
    elif case == "nan":
        bad = z.copy()
        bad[17, 2] = np.nan
        np.save(d / "b.z1.npy", z)
        np.save(d / "b.z2.npy", bad)
    elif case == "orphan":
        np.save(d / "b.z2.npy", z)
    elif case == "empty":
        for f in d.iterdir():
            f.unlink()
    return d


@pytest.mark.parametrize(
    "case, message",
    [
        ("rows", "b.z1.npy: z1 has 50 rows but z2 has 40"),
        ("widths", "b.z1.npy: widths z1 3, z2 3 differ from a.z1.npy's z1 4, z2 4"),
        ("nan", "b.z1.npy: row 17 of z2 holds NaN or inf"),
        ("orphan", "b.z2.npy has no z1 partner"),
        ("empty", "holds no embedding chunks"),
    ],
)
def test_bad_chunks_fail_with_one_message_and_write_nothing(tmp_path, case, message, capsys):
    out = tmp_path / "out"
    assert rr_main([f"embeddings={_bad_chunks(tmp_path, case)}", f"out={out}"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and list(tmp_path.glob(".out*")) == []


def test_export_appears_only_when_complete(tmp_path, monkeypatch):
    import eigtrain.export.files as export

    path, *_ = _embeddings(tmp_path)
    out = tmp_path / "rr"
    assert rr_main([f"embeddings={path}", f"out={out}"]) == 0
    before = (out / "rr.safetensors").read_bytes()

    def fail(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export, "plot_decay", fail)  # the last file of the export fails to be written
    assert rr_main([f"embeddings={path}", f"out={out}", "center=true", "overwrite=true"]) == 2
    assert (out / "rr.safetensors").read_bytes() == before  # the old export is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz", "rr"]  # no staging directory left
    assert rr_main([f"embeddings={path}", f"out={tmp_path / 'new'}", "center=true"]) == 2
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    assert rr_main([f"embeddings={path}", f"out={out}", "center=true", "overwrite=true"]) == 0  # replaced
    assert json.loads((out / "manifest.json").read_text())["source"]["center"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz", "rr"]


def test_a_second_rr_into_one_out_is_refused_at_its_start(tmp_path, capsys):
    """Two eigtrain-rr into one out=: the second is refused in one line before any work (the first holds out=),
    and a failed job leaves no empty directory of its own making."""
    from eigtrain.export.files import claimed_target

    path, *_ = _embeddings(tmp_path)
    out = tmp_path / "rr"
    with claimed_target(out, overwrite=False, rank=0):  # the first eigtrain-rr, still solving
        assert rr_main([f"embeddings={path}", f"out={out}"]) == 2
        assert "being written by another eigtrain-rr" in capsys.readouterr().err
        assert list(out.iterdir()) == []
    assert not out.exists()  # the first one failed (left the block without an export): its empty directory goes
    assert rr_main([f"embeddings={path}", f"out={out}"]) == 0


def test_an_export_that_appears_meanwhile_is_never_replaced_without_overwrite(tmp_path, monkeypatch, capsys):
    """Another writer fills out= while this export is made (a writer that holds no lock: an older eigtrain, a
    copy): the rename refuses to replace it, in one line; it was replaced silently before."""
    import eigtrain.export.files as export

    path, *_ = _embeddings(tmp_path)
    other = tmp_path / "other"
    assert rr_main([f"embeddings={path}", f"out={other}", "center=true"]) == 0
    out = tmp_path / "rr"
    write = export._write_export

    def and_meanwhile(result, staging, source, plot):
        write(result, staging, source, plot)
        for name in ("rr.safetensors", "manifest.json"):
            (out / name).write_bytes((other / name).read_bytes())

    monkeypatch.setattr(export, "_write_export", and_meanwhile)
    assert rr_main([f"embeddings={path}", f"out={out}"]) == 2
    assert "was filled by another writer" in capsys.readouterr().err
    assert (out / "rr.safetensors").read_bytes() == (other / "rr.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz", "other", "rr"]  # no staging left


def test_the_paper_convention_is_the_same_whether_derived_or_stored(tmp_path):
    """Default exports store only the paper convention's eigenvalues (its features follow from the export's
    tensors); ties=variance rotates the export's features, so its export stores them: both give one answer."""
    path, _, _ = _embeddings(tmp_path, n=400, d=24)  # 400 pairs: ties the data do not order
    for ties in ("eigenvalue", "variance"):
        assert rr_main([f"embeddings={path}", f"out={tmp_path / ties}", f"ties={ties}"]) == 0
    derived, stored = (load_file(str(tmp_path / ties / "rr.safetensors")) for ties in ("eigenvalue", "variance"))
    assert "paper_transform" not in derived and "paper_transform" in stored
    assert not torch.equal(derived["transform"], stored["transform"])  # variance order moved features
    a, b = (load_head(tmp_path / ties, dtype=torch.float64, convention="paper") for ties in ("eigenvalue", "variance"))
    torch.testing.assert_close(a.eigenvalues, b.eigenvalues, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.transform, b.transform, rtol=0, atol=1e-9)
