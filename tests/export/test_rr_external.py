"""eigtrain-rr over any model: a timm model (random init, or weights from a local file) or a user's factory,
over shards written by webdataset's own ShardWriter (no eigtrain index)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from eigtrain.export.command import main as rr_main
from eigtrain.export.command import parse_args
from eigtrain.export.external_encoder import EncoderSpecError, build_external_encoder
from eigtrain.export.files import load_head
from eigtrain.export.rayleigh_ritz import solve
from tests.support.ordering import assert_descending_outside_ties

N = 480  # samples in the foreign_shards fixture (tests/conftest.py)
# test_vit (timm's tiny test ViT) at 16 px with 4 px patches; without the final LayerNorm, whose zero-sum
# output (bias 0 at init) would make the Gram matrix singular
VIT = [
    "encoder=timm:test_vit",
    "encoder.kwargs.img_size=16",
    "encoder.kwargs.patch_size=4",
    "encoder.kwargs.global_pool=avg",
    "encoder.kwargs.final_norm=false",
    "encoder.kwargs.fc_norm=false",
]


def _args(shards, out, *extra):
    return [
        *VIT,
        f"data.shards={shards}",
        "data.augment=cifar",
        "data.image_size=16",
        f"out={out}",
        "batch_size=50",
        *extra,
    ]


def test_timm_model_on_foreign_shards_is_ordered_with_unit_gram(foreign_shards, tmp_path):
    from eigtrain.export.external_views import reduce_external

    out = tmp_path / "rr"
    assert rr_main(_args(foreign_shards, out, "num_workers=0", "trivial=keep")) == 0  # the paper's convention: raw span
    tensors = load_file(str(out / "rr.safetensors"))
    values, transform = tensors["eigenvalues"], tensors["transform"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert transform.shape == (64, 64)
    assert_descending_outside_ties(values, manifest["ties"])
    assert 0.9 < values[0] <= 1 + 1e-9 and values[-1] < 0.5 * values[0]  # a real spread, not a flat spectrum
    assert (
        manifest["n"] == N
        and manifest["source"]["kind"] == "encoder"
        and manifest["source"]["encoder"] == "timm:test_vit"
    )

    # The exported basis is orthonormal for the Gram of the pairs it was fitted on: recompute the moments with
    # the same one-pass reduction (deterministic on CPU) and check transform^T G transform = I.
    cfg = parse_args(_args(foreign_shards, out, "num_workers=0", "trivial=keep"))
    env = SimpleNamespace(rank=0, world_size=1, local_rank=0)
    acc, expected, _ = reduce_external(cfg, env, torch.device("cpu"))
    assert expected == acc.n == N
    gff, ggg, kfg, _, _ = acc.second_moments(center=False)
    gram, cross = transform.T @ ((gff + ggg) / 2) @ transform, transform.T @ ((kfg + kfg.T) / 2) @ transform
    torch.testing.assert_close(gram, torch.eye(64, dtype=torch.float64), atol=1e-8, rtol=0)
    torch.testing.assert_close(cross, torch.diag(values), atol=1e-8, rtol=0)
    torch.testing.assert_close(solve(acc, trivial="keep").eigenvalues, values, atol=1e-12, rtol=0)


@pytest.mark.slow
def test_timm_model_on_foreign_shards_same_whatever_the_ranks_workers_and_batches(foreign_shards, tmp_path):
    # 1 rank reading in-process in batches of 32, and 2 ranks x 1 worker in batches of 50: other batches, the
    # same views (each sample's are a function of the seed and its key). One intra-op thread here as in the
    # torchrun ranks: float32 convolutions round differently with other counts.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert rr_main(_args(foreign_shards, tmp_path / "one", "num_workers=0", "batch_size=32")) == 0
    finally:
        torch.set_num_threads(threads)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "eigtrain.export.command",
        *_args(foreign_shards, tmp_path / "two", "num_workers=1"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (_with_paper(tmp_path / d) for d in ("one", "two"))
    # float64 sums merged in another order: equal up to rounding. Eigenvectors of near-equal eigenvalues (480 images
    # order none of these 64 cuts) rotate with rounding, so the solves are compared where they are continuous in the
    # moments: the eigenvalues, and T T^T = G^-1 and T diag(lambda) T^T = G^-1 K G^-1 in the embedding's coordinates.
    for prefix in ("", "paper_"):
        values, t1, t2 = one[prefix + "eigenvalues"], one[prefix + "transform"], two[prefix + "transform"]
        torch.testing.assert_close(two[prefix + "eigenvalues"], values, rtol=0, atol=1e-9 * values.abs().max().item())
        for weights in (torch.ones_like(values), values):
            a, b = (t1 * weights) @ t1.T, (t2 * weights) @ t2.T
            torch.testing.assert_close(b, a, rtol=0, atol=1e-8 * a.abs().max().item(), msg=prefix + "transform")
        torch.testing.assert_close(two[prefix + "mean"], one[prefix + "mean"], rtol=0, atol=1e-12)
    assert json.loads((tmp_path / "two" / "manifest.json").read_text())["n"] == N


def _with_paper(out):
    """The export's tensors with the paper convention's features (derived from them on load)."""
    tensors = load_file(str(out / "rr.safetensors"))
    paper = load_head(out, dtype=torch.float64, convention="paper")
    return {
        **tensors,
        "paper_eigenvalues": paper.eigenvalues,
        "paper_transform": paper.transform,
        "paper_mean": paper.mean,
    }


# -- user factories -----------------------------------------------------------------------------------------
class _Flatten(nn.Module):
    def __init__(self, dim=12, feature_map=False):
        super().__init__()
        self.conv = nn.Conv2d(3, dim, 4, stride=4)
        self.feature_map = feature_map

    def forward(self, x):
        y = torch.relu(self.conv(x)) + 0.01 * self.conv(x)
        return y if self.feature_map else y.mean((2, 3))


def make_encoder(dim=12):
    return _Flatten(dim)


def make_feature_map_encoder():
    return _Flatten(feature_map=True)


def make_tuple_encoder():
    class Two(nn.Module):
        def forward(self, x):
            return x.mean((2, 3)), x.amax((2, 3))

    return Two()


def make_not_a_module():
    return "resnet"


def test_module_factory_with_kwargs(foreign_shards, tmp_path):
    out = tmp_path / "rr"
    assert (
        rr_main(
            [
                "encoder=module:tests.export.test_rr_external:make_encoder",
                "encoder.kwargs.dim=9",
                f"data.shards={foreign_shards}",
                "data.augment=cifar",
                "data.image_size=16",
                f"out={out}",
                "num_workers=0",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dim"] == 9 and manifest["n"] == N and manifest["source"]["kwargs"] == {"dim": 9}


@pytest.mark.parametrize(
    "encoder, message",
    [
        (
            "module:tests.export.test_rr_external:make_feature_map_encoder",
            "returned shape (2, 12, 4, 4) for a batch of 2; it must return (batch, d)",
        ),
        (
            "module:tests.export.test_rr_external:make_tuple_encoder",
            "returned tuple; it must return one tensor of shape (batch, d)",
        ),
        ("module:tests.export.test_rr_external:make_not_a_module", "the factory returned str, not a torch.nn.Module"),
        ("module:tests.export.test_rr_external:no_such_factory", "cannot import 'no_such_factory'"),
        (
            "module:tests.export.test_rr_external:make_encoder encoder.kwargs.width=3",
            "the factory does not take encoder.kwargs {'width': 3}",
        ),
        ("timm:no_such_model_xyz", "Unknown model"),
        ("timm:test_vit encoder.kwargs.patch_size=32", "fails on a batch of shape (2, 3, 16, 16)"),
        ("resnet50", "use timm:NAME"),
    ],
)
def test_bad_models_fail_with_one_message_and_write_nothing(foreign_shards, tmp_path, encoder, message, capsys):
    out = tmp_path / "rr"
    encoder, *extra = encoder.split()
    assert (
        rr_main(
            [
                f"encoder={encoder}",
                *extra,
                f"data.shards={foreign_shards}",
                "data.image_size=16",
                f"out={out}",
                "num_workers=0",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["encoder=timm:test_vit", "out=o"], "exactly one of data.root=DIR"),
        (["encoder=timm:test_vit", "data.root=a", "data.shards=b", "out=o"], "exactly one of data.root=DIR"),
        (["encoder=timm:test_vit", "data.root=a"], "needs out=DIR"),
        (["encoder=timm:test_vit", "data.root=a", "data.augment=strong", "out=o"], "data.augment='strong' is unknown"),
        (
            ["encoder=timm:test_vit", "run_dir=r", "data.root=a", "out=o"],
            "exactly one of run_dir=, checkpoint=, embeddings=, encoder=",
        ),
        (["encoder=timm:test_vit", "data.root=a", "mode=svd", "out=o"], "mode=svd is for two encoders"),
    ],
)
def test_bad_encoder_arguments(args, message, capsys):
    assert rr_main(args) == 2
    assert message in capsys.readouterr().err


# -- local weights ------------------------------------------------------------------------------------------
def test_timm_weights_come_from_the_local_file_classifier_dropped(tmp_path):
    import timm

    kwargs = {"img_size": 16, "patch_size": 4}
    torch.manual_seed(1)
    trained = timm.create_model("test_vit", pretrained=False, num_classes=10, **kwargs)  # a checkpoint with its head
    save_file(trained.state_dict(), str(tmp_path / "model.safetensors"))
    torch.save({"state_dict": trained.state_dict()}, tmp_path / "model.pth")
    for name in ("model.safetensors", "model.pth"):
        model = build_external_encoder("timm:test_vit", str(tmp_path / name), kwargs)
        assert not model.training
        torch.testing.assert_close(model.patch_embed.proj.weight, trained.patch_embed.proj.weight)
        x = torch.rand(3, 3, 16, 16)
        torch.testing.assert_close(model(x), trained.eval().forward_head(trained.forward_features(x), pre_logits=True))
    other = timm.create_model("test_resnet", pretrained=False)
    save_file(other.state_dict(), str(tmp_path / "other.safetensors"))
    with pytest.raises(EncoderSpecError, match="does not fit encoder=timm:test_vit: .* missing key"):
        build_external_encoder("timm:test_vit", str(tmp_path / "other.safetensors"), kwargs)
    with pytest.raises(FileNotFoundError, match="encoder.checkpoint=.* does not exist"):
        build_external_encoder("timm:test_vit", str(tmp_path / "absent.safetensors"), kwargs)


class _Gray(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 10, 3, padding=1)

    def forward(self, x):
        return torch.tanh(self.conv(x)).mean((2, 3))


def make_gray_encoder():
    return _Gray()


def test_module_factory_over_eigtrain_shards_counts_against_the_index(tmp_path):
    from eigtrain.data import read_index
    from eigtrain.data.write import main as shards_main

    shards_main(["source=digits", f"out={tmp_path / 'digits'}"])
    out = tmp_path / "rr"
    assert (
        rr_main(
            [
                "encoder=module:tests.export.test_rr_external:make_gray_encoder",
                f"data.root={tmp_path / 'digits'}",
                "data.augment=digits",
                f"out={out}",
                "num_workers=0",
            ]
        )
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n"] == read_index(tmp_path / "digits").num_samples("train") == 1438 and manifest["dim"] == 10
    assert manifest["source"]["data"]["root"] == str(tmp_path / "digits") and manifest["source"]["init_seed"] == 0
