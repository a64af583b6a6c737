"""Issue 55: the standalone file carries its preprocessing and its metric. Raw images of other sizes than the run's
(PNG files, one-channel and RGB, and a large JPEG) through the metadata's `preprocess` -- the reference
eigtrain.export.preprocess and the snippet docs/export.md shows, run where eigtrain cannot be imported -- into the
TorchScript file and the ONNX file give eigtrain-embed's features on the same images (1e-4); the `similarity` the
metadata states stays finite for an export with a negative eigenvalue."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from eigtrain.export.command import main as rr_main
from eigtrain.export.corpus import main as embed_main
from eigtrain.export.corpus import read_embeddings
from eigtrain.export.preprocess import reference_transform, similarity, weigh
from eigtrain.export.standalone import main as export_main
from eigtrain.export.standalone import read_metadata
from eigtrain.train.command import compose_config, run
from tests.export.test_standalone import BLOCK
from tests.support.foreign_shards import train_overrides
from tests.support.runs import REPO, clean_env, overrides

SIZES = [(20, 20), (28, 28), (45, 37), (8, 8)]  # (H, W); 8x8 is the digits run's own size


def write_images(directory) -> list:
    """A smooth random image (shapes survive a resize) per size, as one-channel and as RGB PNG, and a 120x100 JPEG
    (more than twice any run's size: decoded at reduced scale first)."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    paths = []
    for h, w in [*SIZES, (120, 100)]:
        coarse = rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8)
        rgb = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BICUBIC))
        noisy = np.clip(rgb + rng.integers(-20, 21, rgb.shape), 0, 255).astype(np.uint8)
        if (h, w) == (120, 100):
            Image.fromarray(noisy).save(paths_append(paths, directory / "big-RGB.jpg"), quality=90)
            continue
        Image.fromarray(noisy).save(paths_append(paths, directory / f"rgb-{h}x{w}.png"))
        Image.fromarray(noisy[..., 1]).save(paths_append(paths, directory / f"gray-{h}x{w}.png"))
    return paths


def paths_append(paths: list, path):
    paths.append(path)
    return path


def embed_files(run_dir, paths, tmp_path) -> np.ndarray:
    """eigtrain-embed's features of the image files, packed as they are into one webdataset shard (keys: the stems)."""
    shard = tmp_path / "raw.tar"
    with wds.TarWriter(str(shard)) as sink:
        for path in paths:
            sink.write({"__key__": path.stem, path.suffix[1:]: path.read_bytes(), "cls": 0})  # the RGB run reads cls
    out = tmp_path / "emb"
    args = [f"run_dir={run_dir}", f"out={out}", f"data.shards={shard}", "batch_size=3", "num_workers=0"]
    assert embed_main(args) == 0
    keys, features = read_embeddings(out)
    return features[[keys.index(p.stem) for p in paths]].numpy()


def exported(run_dir) -> dict:
    for fmt in ("torchscript", "onnx"):
        assert export_main([f"run_dir={run_dir}", f"format={fmt}", f"out={run_dir / f'model.{fmt}'}"]) == 0
    return {fmt: run_dir / f"model.{fmt}" for fmt in ("torchscript", "onnx")}


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory, digits_root):
    """A one-channel run at 8x8 (data.root, no data.image_size), 4 steps, its export and both files."""
    run_dir = tmp_path_factory.mktemp("pre_digits") / "run"
    run(compose_config(overrides(run_dir, digits_root, "steps=4", "checkpoint_every=4")))
    assert rr_main([f"run_dir={run_dir}", "num_workers=0", "batch_size=256"]) == 0
    return run_dir, exported(run_dir)


@pytest.fixture(scope="module")
def rgb_run(tmp_path_factory, foreign_shards):
    """An RGB run on shards: workers resize to 20x20 (cover), views 16x16, cifar normalization; both files."""
    run_dir = tmp_path_factory.mktemp("pre_rgb") / "run"
    sizes = ["data.image_size=[20,20]", "data.view_size=[16,16]", "data.image_fit=cover", "steps=2"]
    run(compose_config(train_overrides(run_dir, foreign_shards, *sizes)))
    assert rr_main([f"run_dir={run_dir}", "num_workers=0", "batch_size=256"]) == 0
    return run_dir, exported(run_dir)


def run_files(files: dict, inputs: torch.Tensor) -> dict:
    import onnxruntime

    with torch.no_grad():
        scripted = torch.jit.load(str(files["torchscript"]))(inputs).numpy()
    session = onnxruntime.InferenceSession(str(files["onnx"]), providers=["CPUExecutionProvider"])
    return {"torchscript": scripted, "onnx": session.run(None, {"images": inputs.numpy()})[0]}


@pytest.mark.parametrize("which", ["digits_run", "rgb_run"])
def test_raw_images_of_any_size_through_the_spec_match_eigtrain_embed(which, request, tmp_path):
    run_dir, files = request.getfixturevalue(which)
    paths = write_images(tmp_path / "images")
    expected = embed_files(run_dir, paths, tmp_path)
    meta = read_metadata(files["onnx"])
    assert meta == read_metadata(files["torchscript"])
    spec = meta["preprocess"]
    if which == "digits_run":  # no data.image_size: the size its shards store, which embed now brings images to
        assert spec["channel_order"] == "L" and spec["resize"]["size"] == [8, 8] and spec["view_resize"] is None
        assert spec["mean"] == [0.3053] and spec["std"] == [0.3759]
    else:
        assert (
            spec["channel_order"] == "RGB" and spec["resize"]["size"] == [20, 20] and spec["resize"]["fit"] == "cover"
        )
        assert spec["view_resize"]["size"] == [16, 16] and len(spec["mean"]) == 3
    transform = reference_transform(meta)
    inputs = torch.stack([transform(path) for path in paths])
    assert list(inputs.shape[1:]) == meta["input"]["shape"][1:] and 0 <= inputs.min() and inputs.max() <= 1
    for fmt, got in run_files(files, inputs).items():
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4, err_msg=fmt)
    own = 1 if spec["channel_order"] == "L" else 0  # the image stored in the run's own mode, opened by PIL
    assert transform(Image.open(paths[own])).equal(inputs[own])
    pngs = [p for p in paths if p.suffix == ".png"]
    documented = snippet_features(files["torchscript"], pngs, tmp_path)
    np.testing.assert_allclose(documented, expected[: len(pngs)], rtol=0, atol=1e-4)


def snippet_features(model, paths, tmp_path) -> np.ndarray:
    """docs/export.md's preprocessing snippet, run as written (on `model` and `paths`) where eigtrain is blocked."""
    text = (REPO / "docs" / "export.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def preprocess(path)" in b]
    script = tmp_path / "snippet.py"
    code = code.replace('"quickstart.pt"', "sys.argv[1]")
    script.write_text(
        f"{BLOCK}\nfiles = sys.argv[3:]\n{code}\nimport numpy\nnumpy.save(sys.argv[2], features.detach().numpy())\n"
    )
    args = [sys.executable, "-I", str(script), str(model), str(tmp_path / "snippet.npy"), *map(str, paths)]
    child = subprocess.run(args, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    return np.load(tmp_path / "snippet.npy")


def test_the_stated_metric_is_finite_with_a_negative_eigenvalue(digits_run):
    """A -0.007 eigenvalue (as in a timm export) made sqrt(lambda) weighting NaN and recall 0, silently."""
    run_dir, files = digits_run
    meta = read_metadata(files["torchscript"])
    assert meta["similarity"]["default"] == "cosine" and "max(lambda_j, 0)" in meta["similarity"]["spectral"]
    meta["eigenvalues"][2] = -0.007
    features = torch.randn(7, len(meta["eigenvalues"]), generator=torch.Generator().manual_seed(0))
    assert torch.isnan(features[:, :8] * torch.tensor(meta["eigenvalues"][:8]).sqrt()).any()  # the naive weighting
    spectral = similarity(features[:3], features, meta, k=8, kind="spectral")
    weights = torch.tensor(meta["eigenvalues"][:8], dtype=torch.float64).clamp(min=0)
    f = features[:, :8].double()
    torch.testing.assert_close(spectral.double(), (f[:3] * weights) @ f.T, rtol=1e-5, atol=1e-6)
    cosine = similarity(features[:3], features, meta, k=8)  # the metadata's default
    assert torch.isfinite(spectral).all() and torch.isfinite(cosine).all()
    torch.testing.assert_close(cosine.diagonal(), torch.ones(3))
    with pytest.raises(ValueError, match="unknown"):
        weigh(features, meta, kind="dot")


def test_a_file_without_the_spec_is_one_line():
    with pytest.raises(ValueError, match="export again"):
        reference_transform({"format": "eigtrain-standalone-v1", "eigenvalues": [1.0]})
