"""Training from pretrained weights: any timm backbone (a ViT-B/16-shaped one here, narrow and shallow for the CPU),
its weights from a local file or an already-populated cache, never downloaded; a one-line error when they are not
there."""

import dataclasses

import huggingface_hub
import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

from eigtrain.models import build_encoder
from eigtrain.models.pretrained import PretrainedWeightsError, load_pretrained, resolve_pretrained
from eigtrain.schema import ModelConfig, train_config
from eigtrain.train.command import compose_config, run
from tests.support.runs import overrides, run_cli

VIT_B16 = "timm:vit_base_patch16_224"  # ViT-B/16's architecture; the kwargs below make it CPU-sized
SMALL = "model.timm_kwargs={depth: 2, embed_dim: 64, num_heads: 2}"
SIZE = 32  # digits (8x8) upsampled to 32x32 views: 2x2 patches of 16


@pytest.fixture(scope="module")
def pretrained_file(tmp_path_factory):
    """A timm checkpoint of the small ViT-B/16 (with its 1000-class head, as timm's files have), seeded."""
    torch.manual_seed(123)
    model = timm.create_model(
        "vit_base_patch16_224", pretrained=False, in_chans=1, img_size=SIZE, depth=2, embed_dim=64, num_heads=2
    )
    path = tmp_path_factory.mktemp("weights") / "vit_b16_small.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def vit_overrides(run_dir, digits_root, *extra):
    return overrides(
        run_dir, digits_root, f"model.backbone={VIT_B16}", SMALL, f"data.view_size=[{SIZE},{SIZE}]", *extra
    )


def test_vit_b16_trains_from_a_local_pretrained_file(digits_root, pretrained_file, tmp_path):
    weights = load_file(str(pretrained_file))
    cfg = train_config(
        compose_config(vit_overrides(tmp_path / "run", digits_root, f"model.pretrained={pretrained_file}"))
    )
    # The trainer's builder: every backbone tensor is the file's (its classifier head dropped); a random init is not.
    built = load_pretrained(build_encoder(cfg.model, cfg.dim, (1, SIZE, SIZE)), cfg.model).backbone.state_dict()
    assert built.keys() == {k for k in weights if not k.startswith("head.")}
    assert all(torch.equal(built[k], weights[k]) for k in built)
    fresh = build_encoder(cfg.model, cfg.dim, (1, SIZE, SIZE)).backbone.state_dict()
    assert not torch.equal(fresh["blocks.0.attn.qkv.weight"], weights["blocks.0.attn.qkv.weight"])
    # Two steps at a learning rate too small to move anything visibly: the trained backbone is still the file's.
    assert run(compose_config([*vit_overrides(tmp_path / "run", digits_root), f"model.pretrained={pretrained_file}",
                               "steps=2", "optim.lr=1e-9"]))["step"] == 2  # fmt: skip
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    qkv = "backbone.blocks.0.attn.qkv.weight"
    torch.testing.assert_close(trained[qkv], weights["blocks.0.attn.qkv.weight"], rtol=0, atol=1e-6)
    assert (fresh["blocks.0.attn.qkv.weight"] - weights["blocks.0.attn.qkv.weight"]).abs().max() > 1e-2


def test_missing_weights_file_is_one_line_before_any_work(digits_root, tmp_path):
    missing = tmp_path / "nowhere" / "vit_b16.safetensors"
    args = vit_overrides(tmp_path / "run", digits_root, f"model.pretrained={missing}")
    proc = run_cli(["-m", "eigtrain.train.command", *args], tmp_path, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(missing) in lines[0] and "no such file" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()  # nothing was started


def test_cache_is_read_never_fetched(monkeypatch, tmp_path):
    """model.pretrained=cache: timm's default weights of the backbone from the local Hugging Face cache; an empty
    cache is a one-line error naming it (huggingface_hub would have downloaded them; eigtrain does not ask it to)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    cfg = ModelConfig(backbone="vit_base", pretrained="cache")
    with pytest.raises(PretrainedWeightsError, match=f"not in the Hugging Face cache {tmp_path}"):
        resolve_pretrained(cfg)
    repo = tmp_path / "models--timm--vit_base_patch16_224.augreg2_in21k_ft_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "model.safetensors").write_bytes(b"")
    assert resolve_pretrained(cfg) == repo / "snapshots" / "abc123" / "model.safetensors"


def test_a_torch_checkpoint_loads_and_a_misfit_is_one_line(pretrained_file, tmp_path):
    weights = load_file(str(pretrained_file))
    wrapped = tmp_path / "vit.pth"
    torch.save({"state_dict": weights, "epoch": 3}, wrapped)  # a training checkpoint: read weights-only, unwrapped
    cfg = ModelConfig(
        backbone=VIT_B16, timm_kwargs={"depth": 2, "embed_dim": 64, "num_heads": 2}, pretrained=str(wrapped)
    )
    built = load_pretrained(build_encoder(cfg, 8, (1, SIZE, SIZE)), cfg).backbone.state_dict()
    assert all(torch.equal(built[k], weights[k]) for k in built)
    deeper = dataclasses.replace(cfg, timm_kwargs={"depth": 3, "embed_dim": 64, "num_heads": 2})
    with pytest.raises(PretrainedWeightsError, match=r"does not fit .* 1[0-9] missing key\(s\)") as error:
        load_pretrained(build_encoder(deeper, 8, (1, SIZE, SIZE)), deeper)
    assert "\n" not in str(error.value)
