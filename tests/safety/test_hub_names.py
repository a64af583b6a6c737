"""No network unless asked (issue 51 §6): a timm name that points at a hub (hf-hub:…) or a place is refused in one
line before timm runs, wherever the name comes from: the trainer's model.backbone, a saved config rebuilt by
eigtrain-rr / -eval / -embed / -export (every build goes through build_backbone), or eigtrain-rr encoder=."""

from __future__ import annotations

import socket

import pytest

from eigtrain.export.external_encoder import EncoderSpecError, build_external_encoder
from eigtrain.models.backbones import build_backbone, check_timm_backbone
from eigtrain.schema.groups import ModelConfig

HUB_NAMES = ("hf-hub:timm/resnet18.a1_in1k", "hf_hub:timm/vit_tiny_patch16_224", "local-dir:/tmp/model")


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt is recorded and fails (timm's hub client would retry for ~23 s)."""
    attempts = []

    def connect(self, address):
        attempts.append(address)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", connect)
    return attempts


@pytest.mark.parametrize("name", HUB_NAMES)
def test_hub_backbones_are_refused_in_one_line_without_a_connection(no_network, name):
    with pytest.raises(ValueError, match="eigtrain never downloads") as refused:
        check_timm_backbone(f"timm:{name}")
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="never downloads"):  # a saved config's backbone, rebuilt by any command
        build_backbone(ModelConfig(backbone=f"timm:{name}"), (3, 32, 32))
    with pytest.raises(EncoderSpecError, match="never downloads"):  # eigtrain-rr encoder=timm:…
        build_external_encoder(f"timm:{name}", None, {}, 3)
    assert no_network == []


def test_timm_architecture_names_still_build_offline(no_network):
    model = build_backbone(ModelConfig(backbone="timm:resnet18"), (3, 32, 32))
    assert sum(p.numel() for p in model.parameters()) > 1e6 and no_network == []
