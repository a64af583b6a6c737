"""Rayleigh-Ritz and the evaluation work on the embedding the objective saw: z / ||z|| for SCL (normalize=full),
whose kernel, and so whose eigenfunctions, live in the span of the normalized outputs, not of the raw ones."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from torch import nn

from eigtrain.export.command import main as rr_main
from eigtrain.export.embed import L2Normalized, objective_view
from eigtrain.export.files import load_head, save_export
from eigtrain.export.moments import RRAccumulator
from eigtrain.export.rayleigh_ritz import solve
from eigtrain.models.encoder import PairEncoder


def _solved(z1, z2):
    acc = RRAccumulator(z1.shape[1])
    acc.update(z1, z2)
    return solve(acc)


def test_objective_view_normalizes_only_for_a_normalizing_objective():
    encoder = nn.Linear(3, 4)
    x = torch.randn(5, 3)
    for name, normalize in (("scl", "full"), ("scl", "prefix"), ("lora", "full")):
        cfg = OmegaConf.create({"objective": {"name": name, "normalize": normalize}})
        view, kind = objective_view(encoder, cfg)
        assert kind == "l2_normalized" and torch.allclose(view(x), F.normalize(encoder(x), dim=1))
    for objective in ({"name": "scl", "normalize": "none"}, {"name": "lora"}, {"name": "vicreg"}, {"name": "rq"}):
        assert objective_view(encoder, OmegaConf.create({"objective": objective})) == (encoder, "raw")
    pair = PairEncoder(nn.Linear(3, 4), nn.Linear(3, 4))
    view, kind = objective_view(pair, OmegaConf.create({"objective": {"name": "lora", "normalize": "full"}}))
    assert kind == "l2_normalized" and isinstance(view.phi, L2Normalized) and isinstance(view.psi, L2Normalized)
    z1, z2 = view(x, x)
    assert torch.allclose(z1.norm(dim=1), torch.ones(5)) and torch.allclose(z2.norm(dim=1), torch.ones(5))


def test_the_export_records_its_input_and_its_head_applies_it(tmp_path):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(400, 4, generator=g, dtype=torch.float64) * torch.tensor([3.0, 1, 1, 0.5], dtype=torch.float64)
    z2 = z + 0.3 * torch.randn(400, 4, generator=g, dtype=torch.float64)
    n1, n2 = F.normalize(z, dim=1), F.normalize(z2, dim=1)
    save_export(_solved(n1, n2), tmp_path / "normed", {"kind": "test", "input": "l2_normalized"}, plot=False)
    save_export(_solved(z, z2), tmp_path / "raw", {"kind": "test"}, plot=False)
    normed, raw = load_head(tmp_path / "normed", dtype=torch.float64), load_head(tmp_path / "raw", dtype=torch.float64)
    assert normed.l2_normalize and not raw.l2_normalize
    assert json.loads((tmp_path / "normed" / "manifest.json").read_text())["input"] == "l2_normalized"
    assert json.loads((tmp_path / "raw" / "manifest.json").read_text())["input"] == "raw"
    assert torch.allclose(normed(z), normed(n1)) and torch.allclose(normed(7 * z), normed(n1))  # scale-free
    assert not torch.allclose(raw(z), raw(n1))
    # an export written before the input was recorded holds no metadata: raw, as it was solved
    old = tmp_path / "old.safetensors"
    save_file(load_file(str(tmp_path / "raw" / "rr.safetensors")), str(old))
    assert not load_head(old).l2_normalize
    with pytest.raises(ValueError, match="input='cosine' is unknown"):
        save_export(_solved(z, z2), tmp_path / "bad", {"kind": "test", "input": "cosine"}, plot=False)


@pytest.mark.slow
def test_an_scl_run_is_reduced_and_evaluated_on_its_normalized_embeddings(digits_root, tmp_path, capsys):
    from eigtrain.evaluate.command import main as eval_main
    from eigtrain.export.embed import embed_split, open_run, reduce_pairs
    from eigtrain.train.command import compose_config, run

    run_dir = tmp_path / "run"
    args = [
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.root={digits_root}",
        "steps=4",
        "logging.progress=false",
        "logging.wandb.mode=disabled",
    ]
    run(compose_config(args))  # SCL, normalize=full: the default objective
    assert rr_main([f"run_dir={run_dir}", "batch_size=128", "num_workers=0"]) == 0
    manifest = json.loads((run_dir / "rr" / "manifest.json").read_text())
    assert manifest["input"] == "l2_normalized" == manifest["source"]["input"]

    # the export is the solve on the normalized outputs of the raw encoder, not on the raw outputs
    opened = open_run(str(run_dir))
    raw_encoder = opened.encoder.encoder
    acc_normed, _ = reduce_pairs(opened, "train", 128, 0, 0, 1)
    opened.encoder = raw_encoder
    acc_raw, _ = reduce_pairs(opened, "train", 128, 0, 0, 1)
    spectrum = torch.tensor(manifest["spectrum"], dtype=torch.float64)  # the solve's eigenvalues, before tie ordering
    assert torch.allclose(spectrum, solve(acc_normed).eigenvalues, rtol=1e-9)  # eigtrain-rr's
    assert not torch.allclose(spectrum, solve(acc_raw).eigenvalues, rtol=1e-3)

    # eval embeds through the same view and says so; an export solved on raw embeddings is refused
    assert eval_main([f"run_dir={run_dir}", f"out={tmp_path / 'ev'}", "retrieval=none", "probe=closed_form"]) == 0
    table = (tmp_path / "ev" / "table.md").read_text()
    assert "Embeddings l2-normalized, as the objective saw them." in table
    cuts = json.loads((tmp_path / "ev" / "report.json").read_text())["rr_cuts"]
    assert cuts == manifest["cuts"] and "RR cuts the data do not determine" in table  # eval passes it on
    val_z, _ = embed_split(open_run(str(run_dir)), "val")
    assert torch.allclose(val_z.norm(dim=1), torch.ones(len(val_z)), atol=1e-5)
    stale = tmp_path / "stale_rr"
    shutil.copytree(run_dir / "rr", stale)
    save_file(load_file(str(stale / "rr.safetensors")), str(stale / "rr.safetensors"))  # no input: raw
    manifest_of_old = {k: v for k, v in json.loads((stale / "manifest.json").read_text()).items() if k != "sha256"}
    (stale / "manifest.json").write_text(json.dumps(manifest_of_old))  # an export from before the sha256 record
    assert eval_main([f"run_dir={run_dir}", f"rr={stale}", f"out={tmp_path / 'ev2'}", "retrieval=none"]) == 2
    assert "solved on raw embeddings" in capsys.readouterr().err and not (tmp_path / "ev2").exists()
