"""Which prefixes of a Rayleigh-Ritz export the data determines: the solve on two halves of the rows, compared."""

import json

import numpy as np
import pytest
import torch

from eigtrain.rayleigh_ritz import RRAccumulator
from eigtrain.rr_job import main as rr_main
from eigtrain.rr_job import reduce_embeddings
from eigtrain.rr_prefixes import agreement_curve, prefix_reproducibility

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
    assert "halves of the data (2000 and 2000 samples, 6 features) agree (1 = the same k features): k=1" in (
        capsys.readouterr().out
    )
    assert json.loads((tmp_path / "rr" / "manifest.json").read_text())["halves_n"] == [2000, 2000]
    assert rr_main([f"embeddings={tmp_path / 'emb.npz'}", f"out={tmp_path / 'rr2'}", "halves=false"]) == 0
    assert json.loads((tmp_path / "rr2" / "manifest.json").read_text())["reproducibility"] is None
