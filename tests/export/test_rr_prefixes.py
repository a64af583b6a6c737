"""Which prefixes of a Rayleigh-Ritz export the data determines: the solve on two halves of the rows, compared."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eigtrain.rayleigh_ritz import RRAccumulator, solve
from eigtrain.rr_job import main as rr_main
from eigtrain.rr_job import reduce_embeddings
from eigtrain.rr_prefixes import agreement_curve, order_ties, prefix_reproducibility, tie_groups

# correlations of six latent coordinates between the two views: the first two tie, the rest are apart
RHO = np.array([0.9, 0.9, 0.6, 0.4, 0.2, 0.05])


def _pairs(n=40000, seed=0):
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, len(RHO)))
    mix = rng.normal(size=(len(RHO), len(RHO))) + 2 * np.eye(len(RHO))
    other = RHO * latent + np.sqrt(1 - RHO**2) * rng.normal(size=latent.shape)
    return latent @ mix, other @ mix


def test_a_cut_inside_a_tie_is_not_reproducible_and_a_cut_after_it_is():
    z1, z2 = (torch.from_numpy(z) for z in _pairs())
    acc = RRAccumulator(z1.shape[1], halves=True)
    acc.update(z1, z2, half=torch.arange(len(z1)) % 2 == 1)
    agree = prefix_reproducibility(agreement_curve(acc), [1, 2, 3, 4, 6])
    assert agree[1] < 0.95, agree  # which of the two tied features comes first follows the sample
    assert min(agree[k] for k in (2, 3, 4)) > 0.99 and agree[6] == pytest.approx(1.0), agree
    assert agreement_curve(RRAccumulator(6)) is None  # no halves kept: nothing to say
    with pytest.raises(ValueError, match="needs each row's half"):
        acc.update(z1[:4], z2[:4])


def test_halves_follow_the_global_row_whatever_the_ranks(tmp_path):
    z1, z2 = _pairs(n=3001)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    whole, _ = reduce_embeddings(str(tmp_path / "emb.npz"), False, halves=True)
    parts = [
        reduce_embeddings(str(tmp_path / "emb.npz"), False, rank, 3, block=500, halves=True)[0] for rank in range(3)
    ]
    for part in parts[1:]:
        parts[0].merge(part)
    assert [h.n for h in parts[0].halves] == [h.n for h in whole.halves] == [1501, 1500]
    for mine, theirs in zip(parts[0].halves, whole.halves):
        assert torch.allclose(mine.c_fg, theirs.c_fg, rtol=1e-10) and torch.allclose(mine.mean_f, theirs.mean_f)
    merged, single = (prefix_reproducibility(agreement_curve(a), [1, 2, 4]) for a in (parts[0], whole))
    assert merged == pytest.approx(single, abs=1e-6)


def test_the_export_reports_its_prefixes_agreement(tmp_path, capsys):
    z1, z2 = _pairs(n=4000)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    assert rr_main([f"embeddings={tmp_path / 'emb.npz'}", f"out={tmp_path / 'rr'}"]) == 0
    agree = json.loads((tmp_path / "rr" / "manifest.json").read_text())["reproducibility"]
    assert list(agree) == ["1", "2", "3", "4", "5", "6"] and all(0 <= v <= 1 + 1e-9 for v in agree.values())
    out = capsys.readouterr().out
    assert "halves of the data (2000 and 2000 samples, 6 features) agree (1 = the same k features): k=1" in out
    assert f"k=1 {agree['1']:.3f}," in out  # 3 places: an agreement of 0.948 must not print as a 0.95 cut's 0.95
    assert json.loads((tmp_path / "rr" / "manifest.json").read_text())["halves_n"] == [2000, 2000]
    assert rr_main([f"embeddings={tmp_path / 'emb.npz'}", f"out={tmp_path / 'rr2'}", "halves=false"]) == 0
    assert json.loads((tmp_path / "rr2" / "manifest.json").read_text())["reproducibility"] is None


def test_tie_groups_are_the_runs_between_determined_cuts():
    curve = torch.tensor([0.5, 0.99, 0.7, 0.8, 0.97, 0.96, 1.0])
    assert tie_groups(curve, 0.95) == [[1, 2], [3, 5]]  # cuts after 2, 5 and 6 are determined
    assert tie_groups(curve, 0.0) == [] and tie_groups(curve, 1.0) == [[1, 7]]


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


def test_the_export_orders_the_groups_its_halves_do_not_determine(tmp_path, capsys):
    z1, z2, latent, louder = _scaled_tie(1, True)  # a sample whose halves disagree on the first feature (0.67)
    np.savez(tmp_path / "emb.npz", z1=z1, z2=z2)
    args = [f"embeddings={tmp_path / 'emb.npz'}"]
    assert rr_main([*args, f"out={tmp_path / 'rr'}"]) == 0
    assert "features 1-2 are a group whose order two halves of the data do not determine" in capsys.readouterr().out
    assert rr_main([*args, f"out={tmp_path / 'plain'}", "tie_agreement=0"]) == 0
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    assert manifest["ties"] == {"agreement_below": 0.95, "groups": [[1, 2]], "paper_groups": [[1, 2]]}
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["ties"] is None
    tied, plain = (load_file(str(tmp_path / d / "rr.safetensors")) for d in ("rr", "plain"))
    torch.testing.assert_close(tied["transform"][:, 2:], plain["transform"][:, 2:], rtol=0, atol=0)
    first = lambda t: ((torch.from_numpy(z1) - t["mean"]) @ t["transform"][:, 0]).numpy()  # noqa: E731
    assert abs(np.corrcoef(first(plain), latent[:, louder])[0, 1]) < 0.9
    assert abs(np.corrcoef(first(tied), latent[:, louder])[0, 1]) > 0.999
