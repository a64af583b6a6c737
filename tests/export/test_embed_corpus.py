"""eigtrain-embed on a tiny digits run with its Rayleigh-Ritz export: every validation sample once with its key,
the same output after a real SIGKILL and a rerun, the same (keys, features) on 2 ranks as on 1, and one-line
refusals (no export, foreign out=, k too large, other settings than the manifest's)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from eigtrain.data import read_index
from eigtrain.export.command import main as rr_main
from eigtrain.export.corpus import main as embed_main
from eigtrain.export.corpus import read_embeddings
from eigtrain.export.embed import embed_split, open_run
from eigtrain.export.files import load_head
from tests.support.runs import REPO, overrides, run_cli, torchrun

KILL = str(REPO / "tests" / "support" / "embed_kill_wrapper.py")
N_VAL = 359  # sklearn digits: 1797 samples, val_fraction 0.2 -> 1438 train + 359 val
SMALL = ["split=val", "chunk_size=50", "batch_size=32", "num_workers=1"]  # 8 chunks of 359


@pytest.fixture(scope="module")
def trained(digits_root, tmp_path_factory):
    """A 2-step cpu_debug run on digits and its Rayleigh-Ritz export (run_dir/rr)."""
    from eigtrain.train.command import compose_config, run

    run_dir = tmp_path_factory.mktemp("embed") / "run"
    run(compose_config(overrides(run_dir, digits_root, "steps=2", "checkpoint_every=2")))
    assert rr_main([f"run_dir={run_dir}", "batch_size=256", "num_workers=0"]) == 0
    return run_dir


@pytest.fixture(scope="module")
def whole(trained, tmp_path_factory):
    """The validation split embedded in one uninterrupted run."""
    out = tmp_path_factory.mktemp("whole") / "emb"
    assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL]) == 0
    return out


def _files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_every_validation_sample_once_with_its_key(trained, whole, digits_root):
    keys, features = read_embeddings(whole)
    manifest = json.loads((whole / "manifest.json").read_text())
    assert read_index(digits_root).num_samples("val") == N_VAL
    assert manifest["complete"] and manifest["count"] == N_VAL == len(keys) == len(set(keys))
    assert keys == sorted(keys) and features.shape == (N_VAL, 16) and features.dtype == torch.float32
    assert manifest["settings"]["input"] == "l2_normalized" and len(manifest["eigenvalues"]) == 16
    assert (
        manifest["settings"]["model"]["sha256"]
        == json.loads((trained / "rr" / "manifest.json").read_text())["source"]["sha256"]
    )
    # the same vectors as eigtrain-eval's path: the encoder over the split, then the export's head
    run = open_run(str(trained))
    z, _ = embed_split(run, "val", batch_size=512, num_workers=0)
    expected = load_head(trained / "rr", dtype=torch.float64)(z.double()).float()
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-5)
    assert torch.equal(read_embeddings(whole, k=4)[1], features[:, :4])


def test_a_prefix_in_float16(trained, whole, tmp_path):
    out = tmp_path / "k4"
    assert embed_main([f"run_dir={trained}", f"out={out}", "k=4", "dtype=float16", *SMALL]) == 0
    keys, features = read_embeddings(out)
    full_keys, full = read_embeddings(whole)
    assert keys == full_keys and features.dtype == torch.float16 and features.shape == (N_VAL, 4)
    torch.testing.assert_close(features.float(), full[:, :4], rtol=1e-3, atol=1e-3)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert embed_main([f"run_dir={trained}", f"out={out}", "k=4", "dtype=float16", *SMALL]) == 0  # complete: kept
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_long_embed_says_how_far_it_is(trained, tmp_path, capsys, monkeypatch):
    """Issue 55: progress on long embeds. Past PROGRESS_QUIET_S (here 0) rank 0 prints one line per chunk written:
    samples so far of the split, chunks, seconds; an embed shorter than it prints none of them."""
    import eigtrain.export.corpus as corpus

    monkeypatch.setattr(corpus, "PROGRESS_QUIET_S", 0.0)
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'p'}", *SMALL]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "samples embedded" in line]
    assert lines[0].startswith(f"eigtrain-embed: 50 of {N_VAL:,} samples embedded (1 chunks), "), lines[0]
    assert len(lines) == N_VAL // 50  # one per full chunk
    monkeypatch.setattr(corpus, "PROGRESS_QUIET_S", 1e9)  # an embed shorter than it (not wall time: a loaded CI)
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'q'}", *SMALL]) == 0
    assert "samples embedded" not in capsys.readouterr().out


@pytest.mark.slow
def test_killed_mid_way_and_rerun_gives_the_uninterrupted_output(trained, whole, tmp_path):
    out = tmp_path / "emb"
    proc = run_cli([KILL, f"run_dir={trained}", f"out={out}", *SMALL], tmp_path)
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL, with chunk 2 half-written
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        ".rank-0-chunk-00002.safetensors.tmp",
        "manifest.json",
        *(f"rank-0-chunk-0000{i}.safetensors" for i in (0, 1)),
    ]
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    with pytest.raises(ValueError, match="no complete eigtrain-embed output"):
        read_embeddings(out)
    first = (out / "rank-0-chunk-00000.safetensors").stat().st_mtime_ns
    assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL]) == 0
    assert (out / "rank-0-chunk-00000.safetensors").stat().st_mtime_ns == first  # resumed, not redone
    assert _files(out).keys() == _files(whole).keys()  # the temporary file of the chunk cut short is gone
    for name, data in _files(whole).items():
        if name != "manifest.json":
            assert _files(out)[name] == data, name  # byte-identical chunks
    (a_keys, a), (b_keys, b) = read_embeddings(out), read_embeddings(whole)
    assert a_keys == b_keys and torch.equal(a, b)


@pytest.mark.slow
def test_two_ranks_give_the_one_rank_vectors(trained, whole, tmp_path):
    """Bitwise at batch_size=1: each sample is encoded alone whatever the rank. With larger batches a sample's
    float32 encoding depends by ~1 ulp on the batch it shares (CPU convolution blocking; measured: z differs by
    <= 9e-8 at batch 64 vs 1), which the export's whitening transform amplifies to ~1e-5 on features of unit
    variance (measured 8.1e-6 for 2 ranks vs 1 at batch_size=32): equal to float32 rounding, not bitwise."""
    single = [a for a in SMALL if not a.startswith("batch_size=")] + ["batch_size=1"]
    out = tmp_path / "emb2"
    proc = torchrun(tmp_path, ["-m", "eigtrain.export.corpus"], f"run_dir={trained}", f"out={out}", *single)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name.split("-chunk")[0] for p in out.glob("rank-*")} == {"rank-0", "rank-1"}
    assert embed_main([f"run_dir={trained}", f"out={tmp_path / 'emb1'}", *single]) == 0
    (two_keys, two), (one_keys, one) = read_embeddings(out), read_embeddings(tmp_path / "emb1")
    assert two_keys == one_keys == read_embeddings(whole)[0] and torch.equal(two, one)
    torch.testing.assert_close(two, read_embeddings(whole)[1], rtol=0, atol=1e-4)
    # killed on 1 rank, resumed on 2: the samples of its complete chunks are not embedded again
    mixed = tmp_path / "mixed"
    assert run_cli([KILL, f"run_dir={trained}", f"out={mixed}", *single], tmp_path).returncode == -9
    proc = torchrun(tmp_path, ["-m", "eigtrain.export.corpus"], f"run_dir={trained}", f"out={mixed}", *single)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"rank-0-chunk-00002.safetensors", "rank-1-chunk-00000.safetensors"} <= {p.name for p in mixed.iterdir()}
    mixed_keys, features = read_embeddings(mixed)
    assert mixed_keys == one_keys and torch.equal(features, one)


def test_refusals_are_one_line(trained, whole, tmp_path, capsys):
    def refused(*args):
        assert embed_main([f"run_dir={trained}", *SMALL, *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        return err

    assert "no Rayleigh-Ritz export" in refused(f"out={tmp_path / 'a'}", f"rr={tmp_path / 'none'}")
    bare = tmp_path / "bare"
    shutil.copytree(trained, bare, ignore=shutil.ignore_patterns("rr"))
    assert embed_main([f"run_dir={bare}", f"out={tmp_path / 'b'}", *SMALL]) == 2
    assert "no Rayleigh-Ritz export" in capsys.readouterr().err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert "did not write" in refused(f"out={foreign}")
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1
    assert "did not write" in refused(f"out={trained / 'rr'}")  # another command's manifest.json
    shutil.copytree(whole, tmp_path / "chunks")
    (tmp_path / "chunks" / "manifest.json").unlink()
    assert "did not write" in refused(f"out={tmp_path / 'chunks'}")  # chunk names without the manifest
    assert "k=17" in refused(f"out={tmp_path / 'c'}", "k=17")
    before = _files(whole)
    assert "another k " in refused(f"out={whole}", "k=4")
    assert "another dtype " in refused(f"out={whole}", "dtype=float16")
    assert _files(whole) == before
    assert not any((tmp_path / d).exists() for d in "abc")
    assert load_file(str(next(whole.glob("rank-0-chunk-*"))))["features"].shape[1] == 16


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
def test_any_shards_the_trainer_reads(tmp_path):
    """data.shards=PATTERN: a run trained on webdataset JPEG shards embeds another corpus of such shards."""
    from eigtrain.train.command import compose_config, run
    from tests.support.foreign_shards import TRAIN_PER_CLASS, train_overrides, write_shards

    train = write_shards(tmp_path / "shards", "train", TRAIN_PER_CLASS, 0, TRAIN_PER_CLASS)
    corpus = write_shards(tmp_path / "shards", "corpus", 10, 2, 15)  # 40 new images in 3 shards
    run_dir = tmp_path / "run"
    run(compose_config(train_overrides(run_dir, train, "steps=2", "checkpoint_every=2", "data.num_workers=1")))
    assert rr_main([f"run_dir={run_dir}", "batch_size=16", "num_workers=0"]) == 0
    out = tmp_path / "emb"
    args = [f"run_dir={run_dir}", f"out={out}", f"data.shards='{corpus}'", "batch_size=8", "chunk_size=16"]
    assert embed_main(args) == 0
    keys, features = read_embeddings(out)
    assert keys == sorted(f"corpus-{c}-{i:03d}" for c in range(4) for i in range(10)) and features.shape == (40, 16)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["data"] == f"data.shards={corpus}" and manifest["count"] == 40


def test_chunks_are_tied_to_their_output(trained, whole, tmp_path, capsys):
    """issue 52: a chunk removed after completion is found by read_embeddings and embedded again by a rerun; a
    chunk copied in from an output of other settings is refused naming it; overwrite=true starts over."""
    from eigtrain.export.embed_chunks import chunk_files

    out = tmp_path / "emb"
    shutil.copytree(whole, out)
    removed = chunk_files(out)[3]
    removed.unlink()
    with pytest.raises(ValueError, match=rf"{removed.name} removed or changed"):
        read_embeddings(out)
    assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL]) == 0
    keys, features = read_embeddings(out)
    assert len(keys) == N_VAL == len(set(keys)) and torch.equal(features, read_embeddings(whole)[1])

    other = tmp_path / "other"  # the same run at k = 4: its chunk 0 has the right name and keys, not the settings
    assert embed_main([f"run_dir={trained}", f"out={other}", *SMALL, "k=4"]) == 0
    shutil.copy(other / "rank-0-chunk-00000.safetensors", out / "rank-0-chunk-00000.safetensors")
    capsys.readouterr()
    assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL]) == 2
    assert "rank-0-chunk-00000.safetensors was embedded with other settings" in capsys.readouterr().err
    assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL, "k=4", "overwrite=true"]) == 0
    assert read_embeddings(out)[1].shape == (N_VAL, 4)


def test_a_second_embed_into_one_out_is_refused(trained, tmp_path, capsys):
    from eigtrain.runs.lock import lock_directory, release_directory

    out = tmp_path / "emb"
    out.mkdir()
    held = lock_directory(out)  # another eigtrain-embed writing there
    try:
        assert embed_main([f"run_dir={trained}", f"out={out}", *SMALL]) == 2
    finally:
        release_directory(held)
    assert "being written by another eigtrain-embed" in capsys.readouterr().err
    assert list(out.iterdir()) == []
