"""eigtrain-embed images=: a folder of image files (keys: their relative paths) or a file list, each image brought
to the run's input as its shards are; and every command (train, rr, eval, embed) normalizing with the mean/std the
run trained with: the preset's, or what its pretrained weights state (issue 55)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from eigtrain.export import corpus, embed
from eigtrain.export.command import main as rr_main
from eigtrain.export.corpus import main as embed_main
from eigtrain.export.corpus import read_embeddings
from eigtrain.models import build_encoder
from eigtrain.schema import train_config
from eigtrain.train import command as train_command
from tests.support.runs import overrides

SMALL = ["chunk_size=50", "batch_size=32", "num_workers=0"]


def _train(run_dir, digits_root, *extra):
    train_command.run(
        train_command.compose_config(overrides(run_dir, digits_root, "steps=2", "checkpoint_every=2", *extra))
    )
    assert rr_main([f"run_dir={run_dir}", "batch_size=256", "num_workers=0"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def trained(digits_root, tmp_path_factory):
    return _train(tmp_path_factory.mktemp("images") / "run", digits_root)


@pytest.fixture(scope="module")
def val_images(trained, tmp_path_factory):
    """The first 40 validation digits as 8-bit grayscale PNGs in a flat folder (and one sub-folder), by key."""
    run = embed.open_run(str(trained))
    batch = next(iter(embed.split_stream(run, "val", 40, 0, 0, 1)))
    folder = tmp_path_factory.mktemp("flat")
    (folder / "sub").mkdir()
    names = {}
    for i, (key, image) in enumerate(zip(batch["key"], batch["image"])):
        name = f"{'sub/' if i % 4 == 0 else ''}{key}.png"
        Image.fromarray(image[0].numpy()).save(folder / name)
        names[name] = key
    return folder, names


def test_a_flat_folder_gives_the_shards_features(trained, val_images, tmp_path):
    folder, names = val_images
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'shards'}", "split=val", *SMALL]) == 0
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'files'}", f"images={folder}", *SMALL]) == 0
    keys, features = read_embeddings(tmp_path / "files")
    assert keys == sorted(names) and any(k.startswith("sub/") for k in keys)  # keys: paths relative to the folder
    shard_keys, shard_features = read_embeddings(tmp_path / "shards")
    rows = [shard_keys.index(names[k]) for k in keys]
    torch.testing.assert_close(features, shard_features[rows], rtol=0, atol=1e-5)
    manifest = json.loads((tmp_path / "files" / "manifest.json").read_text())
    assert manifest["settings"]["data"] == f"images={folder.resolve()}" and manifest["count"] == len(names)


def test_a_file_list_of_any_size_and_channels(trained, val_images, tmp_path):
    folder, names = val_images
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (30, 20, 3), dtype=np.uint8)).save(tmp_path / "rgb.png")  # RGB, 30x20
    Image.fromarray(rng.integers(0, 256, (5, 9), dtype=np.uint8)).save(tmp_path / "small.png")  # one channel, 5x9
    first = sorted(names)[1]
    listing = tmp_path / "list.txt"
    listing.write_text(f"rgb.png\n# a comment\n\n{tmp_path / 'small.png'}\n{folder / first}\n")
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'out'}", f"images={listing}", *SMALL]) == 0
    keys, features = read_embeddings(tmp_path / "out")
    assert keys == sorted(["rgb.png", str(tmp_path / "small.png"), str(folder / first)])
    assert features.shape == (3, 16) and torch.isfinite(features).all()


def test_bad_lines_and_corrupt_images_are_one_line(trained, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not an image")
    listing = tmp_path / "list.txt"
    listing.write_text("../notes.txt\n")
    (tmp_path / "sub").mkdir()
    listing.rename(tmp_path / "sub" / "list.txt")
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'a'}", f"images={tmp_path / 'sub' / 'list.txt'}"]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "line 1: ../notes.txt is not an image file" in line
    assert not (tmp_path / "a").exists()  # refused before anything was written
    folder = tmp_path / "imgs"
    folder.mkdir()
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(folder / "good.png")
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'b'}", f"images={folder}", *SMALL]) == 2
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and f"{folder / 'broken.png'}: cannot be used as an image" in line
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'c'}", f"images={folder}", "split=val"]) == 2
    assert "images= is the data embedded" in capsys.readouterr().err


@pytest.mark.parametrize("pretrained", [False, True])
def test_every_command_normalizes_as_the_run_trained(digits_root, tmp_path, monkeypatch, pretrained):
    """train, rr, eval (embed_split) and embed build their normalization from one decision: the preset's, or the
    mean/std a pretrained file states (on main the file's were never read: training used the preset's)."""
    seen = []
    for module in (train_command, embed, corpus):
        real = module.build_augment

        def spy(preset, *args, _real=real, **kwargs):
            seen.append((tuple(kwargs["mean"]), tuple(kwargs["std"])))
            return _real(preset, *args, **kwargs)

        monkeypatch.setattr(module, "build_augment", spy)
    extra, expected = [], ((0.3053,), (0.3759,))  # the digits preset's
    if pretrained:
        cfg = train_config(train_command.compose_config(overrides(tmp_path / "run", digits_root)))
        backbone = build_encoder(cfg.model, cfg.dim, (1, 8, 8)).backbone.state_dict()
        weights = tmp_path / "weights.safetensors"
        save_file({k: v.contiguous() for k, v in backbone.items()}, str(weights), {"mean": "[0.4]", "std": "[0.2]"})
        extra, expected = [f"model.pretrained={weights}"], ((0.4,), (0.2,))
    run_dir = _train(tmp_path / "run", digits_root, *extra)
    recorded = json.loads((run_dir / "model.json").read_text())["normalization"]
    assert (tuple(recorded["mean"]), tuple(recorded["std"])) == expected
    embed.embed_split(embed.open_run(str(run_dir)), "val", num_workers=0)  # eigtrain-eval's path
    assert embed_main([f"run_dir={run_dir}", f"out={tmp_path / 'emb'}", "split=val", *SMALL]) == 0
    assert len(seen) >= 4 and set(seen) == {expected}, seen  # train, rr, eval, embed
