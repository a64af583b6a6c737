"""Encoders: output shapes of every backbone, the CIFAR stem, the projector, the two-encoder module."""

import pytest
import torch
from torch import nn

from eigtrain.models import Encoder, PairEncoder, build_backbone, build_encoder
from eigtrain.schema import ModelConfig, train_config

BASE = dict(
    width=8,
    depth=2,
    cifar_stem=False,
    patch_size=8,
    projector_hidden=32,
    projector_layers=2,
    projector_batch_norm=True,
    sync_batch_norm=False,
    context=None,
)


@pytest.mark.parametrize(
    "backbone, shape",
    [
        ("tiny_cnn", (1, 8, 8)),
        ("mlp", (5,)),
        ("resnet18", (3, 32, 32)),
        ("vit_tiny", (3, 32, 32)),
    ],
)
def test_encoder_maps_a_batch_to_dim(backbone, shape):
    torch.manual_seed(0)
    encoder = build_encoder(ModelConfig(**BASE, backbone=backbone), dim=12, input_shape=shape)
    assert isinstance(encoder, Encoder)
    z = encoder(torch.randn(4, *shape))
    assert z.shape == (4, 12) and torch.isfinite(z).all()
    assert encoder.features(torch.randn(4, *shape)).shape == (4, encoder.backbone.num_features)


def test_tiny_cnn_pool_grid_keeps_where_a_feature_is():
    """model.pool=2: a 2 x 2 grid of each channel's average (4x the features). A blob moved from one quadrant of
    the image to the opposite one moves to another grid cell; the global pool (pool=1) cannot tell the two apart
    (on a zero background, shifted by a multiple of the stride, away from the border)."""
    torch.manual_seed(0)
    grid = build_backbone(ModelConfig(**{**BASE, "backbone": "tiny_cnn"}, pool=2), (1, 32, 32)).eval()
    flat = build_backbone(ModelConfig(**{**BASE, "backbone": "tiny_cnn"}), (1, 32, 32)).eval()
    flat.load_state_dict(grid.state_dict())
    here, there = torch.zeros(2, 1, 1, 32, 32)
    here[..., 8:10, 8:10] = 3.0
    there[..., 20:22, 20:22] = 3.0
    assert grid.num_features == 4 * flat.num_features == grid(here).shape[1] == 4 * 2 * BASE["width"]
    assert torch.allclose(flat(here), flat(there), atol=1e-6) and flat(here).abs().max() > 0
    assert not torch.allclose(grid(here), grid(there), atol=1e-3)
    assert torch.allclose(grid(here).view(2 * BASE["width"], 2, 2).mean((1, 2)), flat(here)[0], atol=1e-6)


def test_a_pool_below_one_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="model.pool=0"):
        build_backbone(ModelConfig(**{**BASE, "backbone": "tiny_cnn"}, pool=0), (1, 28, 28))


def test_resnet_cifar_stem_keeps_resolution():
    plain = build_backbone(ModelConfig(backbone="resnet18"), (3, 32, 32))
    cifar = build_backbone(ModelConfig(backbone="resnet18", cifar_stem=True), (3, 32, 32))
    assert plain.conv1.kernel_size == (7, 7) and plain.conv1.stride == (2, 2)
    assert cifar.conv1.kernel_size == (3, 3) and cifar.conv1.stride == (1, 1)
    assert isinstance(cifar.maxpool, torch.nn.Identity)
    x = torch.randn(2, 3, 32, 32)
    # The stem's output keeps 32x32 (plain: 8x8 after conv1 + max-pool).
    assert cifar.forward_features(x).shape[-1] == 4 and plain.forward_features(x).shape[-1] == 1


def test_vit_image_and_patch_size_are_configurable():
    vit = build_backbone(ModelConfig(backbone="vit_small", patch_size=12), (3, 48, 48))
    assert vit.patch_embed.num_patches == 16 and vit.num_features == 384
    with pytest.raises(ValueError, match="patch_size=10 must divide the image size 48x48"):
        build_backbone(ModelConfig(backbone="vit_tiny", patch_size=10), (3, 48, 48))


def test_projector_of_the_papers_runs():  # configs/model/resnet18.yaml's projector; defaults: tests/config
    encoder = build_encoder(
        ModelConfig(backbone="tiny_cnn", width=8, projector_hidden=2048, projector_layers=2),
        dim=512,
        input_shape=(3, 8, 8),
    )
    linears = [m for m in encoder.projector if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(16, 2048), (2048, 2048), (2048, 512)]


def test_pair_encoder_has_independent_phi_and_psi_with_context_overrides():
    cfg = ModelConfig(**{**BASE, "backbone": "tiny_cnn", "context": {"backbone": "mlp", "width": 16}})
    pair = build_encoder(cfg, dim=6, input_shape=(1, 8, 8), context_shape=(10,))
    assert isinstance(pair, PairEncoder)
    assert pair.psi.backbone.num_features == 16
    zx, za = pair(torch.randn(3, 1, 8, 8), torch.randn(3, 10))
    assert zx.shape == za.shape == (3, 6)
    assert not set(map(id, pair.phi.parameters())) & set(map(id, pair.psi.parameters()))


def test_unknown_backbone_and_wrong_input_kind_are_clear_errors():
    with pytest.raises(ValueError, match="model.backbone='resnet7' is not known; allowed: tiny_cnn"):
        build_backbone(ModelConfig(backbone="resnet7"), (3, 32, 32))
    with pytest.raises(ValueError, match="needs image inputs"):
        build_backbone(ModelConfig(backbone="resnet18"), (10,))


def test_resnet_runs_use_sync_batch_norm_on_several_gpus_unless_switched_off(caplog):
    from eigtrain.models import use_sync_batch_norm
    from eigtrain.train.command import compose_config

    def kinds(model):
        return (
            sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules()),
            sum(type(m) in (nn.BatchNorm1d, nn.BatchNorm2d) for m in model.modules()),
        )

    on = train_config(compose_config(["model=resnet18"])).model
    off = train_config(compose_config(["model=resnet18", "model.sync_batch_norm=false"])).model
    assert on.sync_batch_norm and not off.sync_batch_norm
    gpu = torch.device("cuda", 0)  # only converted, never run
    synced, plain = kinds(use_sync_batch_norm(build_encoder(on, 8, (3, 32, 32)), on.sync_batch_norm, 2, gpu))
    assert synced > 20 and plain == 0  # every BatchNorm of the backbone and the projector
    for enabled, world, device in ((on.sync_batch_norm, 1, gpu), (off.sync_batch_norm, 2, gpu)):
        assert kinds(use_sync_batch_norm(build_encoder(on, 8, (3, 32, 32)), enabled, world, device))[0] == 0
    # PyTorch's SyncBatchNorm is GPU-only: CPU jobs keep BatchNorm and say so.
    assert kinds(use_sync_batch_norm(build_encoder(on, 8, (3, 32, 32)), True, 2, torch.device("cpu")))[0] == 0
    assert "SyncBatchNorm needs GPUs" in caplog.text
