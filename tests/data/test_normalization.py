"""The one rule for a run's mean/std (eigtrain.data.normalization.decide): data.mean/std, else what pretrained
weights state (a file's metadata, timm's pretrained_cfg), else the preset's; a preset or weights that do not fit
the images' channels refused in one line; data.image_size the same rule in eigtrain-train and eigtrain-rr."""

import json

import pytest
import torch
from safetensors.torch import save_file

from eigtrain.data.normalization import NormalizationError, Stated, as_trained, decide
from eigtrain.export.rr_config import parse_args
from eigtrain.models import pretrained
from eigtrain.schema import ModelConfig, train_config
from eigtrain.train.compose import compose_config

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def test_preset_unless_the_weights_or_the_user_say_otherwise():
    assert decide("cifar", None, None, 3)[0].mean == (0.4914, 0.4822, 0.4465)
    weights = Stated(*IMAGENET, "timm's pretrained_cfg of resnet18")
    norm, warning = decide("digits", None, None, 3, weights)  # the preset's one value is never used
    assert (norm.mean, norm.std, warning) == (*IMAGENET, None) and "resnet18" in norm.source
    norm, warning = decide("cifar", [0.5, 0.5, 0.5], [0.25] * 3, 3, weights)
    assert norm.mean == (0.5,) * 3 and "differ from what the pretrained weights state" in warning
    assert decide("cifar", list(IMAGENET[0]), list(IMAGENET[1]), 3, weights)[1] is None  # the same: no warning
    assert decide("none", None, None, 3)[0].mean == (0.5,)  # `none` is channel-neutral
    gray = decide("grayscale", None, None, 1, Stated((0.5,) * 3, (0.5,) * 3, "vit"))[0]
    assert (gray.mean, gray.std) == ((0.5,), (0.5,))  # equal per channel: fits one channel


@pytest.mark.parametrize(
    "args, match",
    [
        (("cifar", None, None, 1), r"normalizes 3: use data.augment=grayscale or none or give data.mean"),
        (("cifar", [0.5], None, 3), r"^give data.mean and data.std together"),
        (("cifar", [0.5, 0.5], [0.2, 0.2], 3), r"^the images have 3 channel\(s\) but data.mean/data.std normalizes 2"),
        (("none", None, None, 1, Stated(*IMAGENET, "x.safetensors")), r"pretrained weights \(x.safetensors\) normal"),
    ],
)
def test_what_does_not_fit_the_channels_is_one_line(args, match):
    with pytest.raises(NormalizationError, match=match) as error:
        decide(*args)
    assert "\n" not in str(error.value)


def test_a_run_from_before_the_record_keeps_what_it_trained_with():
    assert as_trained(None, "digits", None, None).mean == (0.3053,)  # even on RGB images: as it trained
    recorded = {"mean": [0.1], "std": [0.2], "source": "preset x"}
    assert as_trained(recorded, "digits", None, None).mean == (0.1,)


def test_weights_state_their_normalization(tmp_path, monkeypatch):
    file = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(1)}, str(file), metadata={"mean": "[0.4, 0.4, 0.4]", "std": "[0.2, 0.3, 0.2]"})
    stated = pretrained.stated_normalization(ModelConfig(pretrained=str(file)))
    assert stated == ((0.4, 0.4, 0.4), (0.2, 0.3, 0.2), f"the metadata of {file}")
    hub = tmp_path / "hub"
    hub.mkdir()
    save_file({"w": torch.zeros(1)}, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps({"pretrained_cfg": {"mean": [0.1] * 3, "std": [0.3] * 3}}))
    assert pretrained.file_normalization(hub / "model.safetensors")[:2] == ((0.1,) * 3, (0.3,) * 3)
    save_file({"w": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
    assert pretrained.file_normalization(tmp_path / "plain.safetensors") is None  # says nothing: the preset's
    monkeypatch.setattr(pretrained, "_cached_file", lambda name: tmp_path / "plain.safetensors")
    cached = pretrained.stated_normalization(ModelConfig(backbone="resnet18", pretrained="cache"))
    assert cached == (*IMAGENET, "timm's pretrained_cfg of resnet18")  # timm's, never read before issue 55


def test_a_one_value_preset_on_rgb_images_is_said(tmp_path):
    """Issue 55: digits' one-value normalization applied to RGB images silently; now said in one line (the trainer
    logs it at start), its value serving each channel as before."""
    from eigtrain.train.checks import decide_normalization

    cfg = compose_config(["experiment=cpu_debug", f"run_dir={tmp_path}/r"])
    norm, warning = decide_normalization(cfg, 3)
    assert norm.mean == (0.3053,) and "\n" not in warning
    assert warning.startswith("augmentation preset 'digits' normalizes one channel and the images have 3")
    assert "data.augment=cifar or imagenet" in warning
    assert decide("none", None, None, 3)[1] is None and decide("cifar", None, None, 3)[1] is None


def test_image_size_is_one_rule_in_train_and_rr():
    """Issue 55: data.image_size=32 was refused by eigtrain-train ([H, W] only) and [32, 32] by eigtrain-rr."""
    rr = ["encoder=timm:resnet18", "data.root=d", "out=o"]
    for value, size in (("32", [32, 32]), ("[32,24]", [32, 24])):
        assert (
            train_config(compose_config(["experiment=cpu_debug", f"data.image_size={value}"])).data.image_size == size
        )
        assert parse_args([*rr, f"data.image_size={value}"]).data.image_size == size
    for bad in ("0", "[32]", "[32,0]"):
        with pytest.raises(ValueError, match=r"^data.image_size must be a positive integer N \(N x N\) or \[H, W\]"):
            train_config(compose_config(["experiment=cpu_debug", f"data.image_size={bad}"]))
        with pytest.raises(ValueError, match=r"^data.image_size must be a positive integer N \(N x N\) or \[H, W\]"):
            parse_args([*rr, f"data.image_size={bad}"])
