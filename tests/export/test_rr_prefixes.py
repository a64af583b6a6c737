"""Which cuts of a Rayleigh-Ritz export the data determine (per-cut errors from folds of the rows), and the opt-in
variance order inside the undetermined groups (ties=variance)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eigtrain.export.command import main as rr_main
from eigtrain.export.command import reduce_embeddings
from eigtrain.export.moments import RRAccumulator
from eigtrain.export.prefixes import cut_errors, order_ties, tie_groups, undetermined_cuts
from eigtrain.export.rayleigh_ritz import solve

# correlations of six latent coordinates between the two views: the first two tie, the rest are apart
RHO = np.array([0.9, 0.9, 0.6, 0.4, 0.2, 0.05])


def _pairs(n=40000, seed=0):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, len(RHO)))
    mix = rng.normal(size=(len(RHO), len(RHO))) + 2 * np.eye(len(RHO))
    other = RHO * latent + np.sqrt(1 - RHO**2) * rng.normal(size=latent.shape)
    return latent @ mix, other @ mix


def test_a_cut_inside_a_tie_is_undetermined_and_the_cuts_around_it_are_not():
    z1, z2 = (torch.from_numpy(z) for z in _pairs())
    acc = RRAccumulator(z1.shape[1], folds=8)
    acc.update(z1, z2, fold=torch.arange(len(z1)) % 8)
    assert undetermined_cuts(cut_errors(solve(acc), acc)) == [1]  # which of the two tied features comes first
    assert cut_errors(solve(acc), RRAccumulator(6)) is None  # no folds kept: nothing to say
    with pytest.raises(ValueError, match="needs each row's fold"):
        acc.update(z1[:4], z2[:4])


def test_folds_follow_the_global_row_whatever_the_ranks(tmp_path):
    z1, z2 = _pairs(n=3001)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    whole, _ = reduce_embeddings(str(tmp_path / "emb.npz"), False, folds=4)
    parts = [reduce_embeddings(str(tmp_path / "emb.npz"), False, rank, 3, block=500, folds=4)[0] for rank in range(3)]
    for part in parts[1:]:
        parts[0].merge(part)
    assert [f.n for f in parts[0].folds] == [f.n for f in whole.folds] == [751, 750, 750, 750]
    for mine, theirs in zip(parts[0].folds, whole.folds):
        # folds hold what one encoder on two views uses: the cross moment's symmetric part (eigtrain.export.fold_sums)
        sym_mine, sym_theirs = ((a.c_fg + a.c_fg.T) / 2 for a in (mine, theirs))
        assert torch.allclose(sym_mine, sym_theirs, rtol=1e-10) and torch.allclose(mine.mean_f, theirs.mean_f)
        assert torch.allclose(mine.c_ff + mine.c_gg, theirs.c_ff + theirs.c_gg, rtol=1e-10)
    merged, single = (cut_errors(solve(a), a) for a in (parts[0], whole))
    torch.testing.assert_close(merged, single, rtol=1e-6, atol=1e-9)


def test_the_export_reports_its_cuts(tmp_path, capsys):
    """The manifest's cuts and the printed line agree with the errors; the tie is flagged in most samples (an exact
    tie's estimate is a ratio of noises: flagged in about 9 of 10, tests/export/test_rr_ground_truth.py), the clear
    cuts in none."""
    undetermined = []
    for seed in range(3):
        z1, z2 = _pairs(seed=seed)
        np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
        assert rr_main([f"embeddings={tmp_path / 'emb.npz'}", f"out={tmp_path / 'rr'}", "overwrite=true"]) == 0
        cuts = json.loads((tmp_path / "rr" / "manifest.json").read_text())["cuts"]
        assert len(cuts["error"]) == 5 and all(e >= 0 for e in cuts["error"]) and cuts["folds_n"] == [5000] * 8
        assert cuts["undetermined"] == [k + 1 for k, e in enumerate(cuts["error"]) if e >= cuts["undetermined_at"]]
        assert cuts["tested"] == 5 and cuts["features"] == 6
        printed = capsys.readouterr().out
        if cuts["undetermined"]:
            assert "do not determine the cut after feature(s) 1 of 6" in printed
        else:
            assert "the data determine every tested cut of the 6 features" in printed
        undetermined.append(cuts["undetermined"])
    assert undetermined.count([1]) >= 2 and all(u in ([], [1]) for u in undetermined), undetermined
    assert rr_main([f"embeddings={tmp_path / 'emb.npz'}", f"out={tmp_path / 'rr2'}", "folds=0"]) == 0
    assert json.loads((tmp_path / "rr2" / "manifest.json").read_text())["cuts"] is None
    with_folds, without = (load_file(str(tmp_path / d / "rr.safetensors")) for d in ("rr", "rr2"))
    for key, value in with_folds.items():  # the folds add the report, never change the export
        torch.testing.assert_close(without[key], value, rtol=0, atol=1e-10 * max(value.abs().max().item(), 1.0))


def test_tie_groups_are_the_runs_between_determined_cuts():
    assert tie_groups([1, 3, 4], 7) == [[1, 2], [3, 5]]  # cuts after 2, 5, 6, 7 are determined
    assert tie_groups([], 7) == [] and tie_groups(list(range(1, 8)), 7) == [[1, 8]]
    assert tie_groups([1, 2, 3], 3) == [[1, 4]]  # features past the tested cuts are in no group, whatever their order


def _scaled_tie(seed: int, mix: bool, n: int = 20000):
    """Latent coordinates 1 and 2 tie (the same correlation across views); coordinate 2 has 3x the scale (then an
    optional invertible mix): (z1, z2, latent, the index of the latent carrying more of the embedding's variance)."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, len(RHO)))
    other = RHO * latent + np.sqrt(1 - RHO**2) * rng.normal(size=latent.shape)
    out = np.diag([1.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    if mix:
        out = out @ (rng.normal(size=(len(RHO), len(RHO))) + 2 * np.eye(len(RHO)))
    louder = int(np.argmax(np.linalg.norm(out[:2], axis=1)))
    return latent @ out, other @ out, latent, louder


def test_a_tie_is_ordered_by_variance_and_nothing_outside_it_moves():
    z1, z2, latent, louder = (torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in _scaled_tie(0, False))
    acc = RRAccumulator(6)
    acc.update(z1, z2)
    plain = solve(acc)
    assert abs(np.corrcoef(plain.apply(z1)[:, 0], latent[:, louder])[0, 1]) < 0.9  # by eigenvalue: a mix of the two
    tied = order_ties(plain, acc, [[1, 2]], center=True)
    assert abs(np.corrcoef(tied.apply(z1)[:, 0], latent[:, louder])[0, 1]) > 0.999  # the louder one of the tie
    torch.testing.assert_close(tied.transform[:, 2:], plain.transform[:, 2:], rtol=0, atol=0)  # past the group
    torch.testing.assert_close(tied.eigenvalues[:2].sum(), plain.eigenvalues[:2].sum(), rtol=1e-12, atol=0)
    assert torch.all((tied.eigenvalues[:2] - 0.9).abs() < 0.01)
    assert torch.equal(tied.eigenvalues[2:], plain.eigenvalues[2:])
    gff, ggg, _, _, _ = acc.second_moments(True)
    torch.testing.assert_close(tied.transform.T @ ((gff + ggg) / 2) @ tied.transform, torch.eye(6, dtype=torch.float64))


def test_ties_variance_orders_the_undetermined_groups_and_the_default_does_not(tmp_path, capsys):
    z1, z2, latent, louder = _scaled_tie(1, True)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    args = [f"embeddings={tmp_path / 'emb.npz'}"]
    assert rr_main([*args, f"out={tmp_path / 'rr'}", "ties=variance"]) == 0
    assert "ties=variance: features 1-2 reordered by the embedding's variance" in capsys.readouterr().out
    assert rr_main([*args, f"out={tmp_path / 'plain'}"]) == 0
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    assert manifest["ties"] == {"order": "variance", "groups": [[1, 2]]}
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["ties"] is None
    tied, plain = (load_file(str(tmp_path / d / "rr.safetensors")) for d in ("rr", "plain"))
    torch.testing.assert_close(tied["transform"][:, 2:], plain["transform"][:, 2:], rtol=0, atol=0)
    first = lambda t: ((torch.from_numpy(z1) - t["mean"]) @ t["transform"][:, 0]).numpy()  # noqa: E731
    assert abs(np.corrcoef(first(plain), latent[:, louder])[0, 1]) < 0.9
    assert abs(np.corrcoef(first(tied), latent[:, louder])[0, 1]) > 0.999


def test_fewer_folds_at_large_d_still_take_every_row(tmp_path, monkeypatch):
    """At large d the accumulator keeps fewer folds than asked (moments.FOLDS_BYTES): rows are assigned among those."""
    import eigtrain.export.moments as moments

    z1, z2 = _pairs(n=900)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    monkeypatch.setattr(moments, "FOLDS_BYTES", 24 * z1.shape[1] ** 2 * 3)  # room for 3 folds
    acc, total = reduce_embeddings(str(tmp_path / "emb.npz"), False, folds=8)
    assert acc.fold_count == 3 and acc.n == total == 900 and [f.n for f in acc.folds] == [300] * 3
    with pytest.raises(ValueError, match="fold must lie in"):
        acc.update(torch.from_numpy(z1[:4]), torch.from_numpy(z2[:4]), fold=torch.full((4,), 3))
