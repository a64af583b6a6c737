"""Shards that other tools wrote (webdataset's ShardWriter, jpg + cls, one class per shard), served over HTTP by a
server on 127.0.0.1 and named by a brace pattern: batches mix classes, one pass covers every sample once across
2 ranks, the cursor resumes exactly (1 and 2 ranks, and a whole training run), the user's directory stays byte
for byte as it was, and each kind of bad input gives one message naming the shard (and key)."""

import functools
import hashlib
import http.server
import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from eigtrain.data import CorruptDataError, ShardError, gpu_decode
from eigtrain.data.gpu_decode import choose_jpeg_device
from eigtrain.data.write import main as shards_cli
from eigtrain.schema import ConfigError
from eigtrain.train.checks import validate
from tests.support.foreign_shards import (
    CLASSES,
    PATTERN,
    PER_CLASS,
    QuietHandler,
    good_samples,
    jpeg,
    train_overrides,
    write_class_ordered,
    write_shard,
)
from tests.support.runs import assert_same_final_weights, check, free_port, losses, torchrun
from tests.support.streams import open_stream

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(shard directory, base URL) of class-ordered shards behind an HTTP server on 127.0.0.1."""
    directory = write_class_ordered(tmp_path_factory.mktemp("user_shards"))
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield directory, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def stream(url, cache, **kw):
    args = dict(
        batch_size=12, num_workers=0, label_key="cls", image_size=16, image_fit="whole", cache_dir=cache, seed=1
    )
    return open_stream(shards=url, **{**args, **kw})


def take(s, n):
    return [b for _, b in zip(range(n), s)]


def tree_digest(directory: Path) -> dict:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def same_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["key"] == w["key"]
        assert torch.equal(g["image"], w["image"]) and torch.equal(g["size"], w["size"])
        assert torch.equal(g["label"], w["label"])


# ---------------------------------------------------------------------------------------------- works


def test_http_brace_pattern_counts_once_and_batches_mix_classes(served, tmp_path):
    _, base = served
    url = f"{base}/{PATTERN}"
    mixed = stream(url, tmp_path, shuffle_block=48)
    assert mixed.shards == [(f"{base}/cls-{i:06d}.tar", PER_CLASS) for i in range(CLASSES)]
    assert len(list(tmp_path.glob("shard-counts-*.json"))) == 1  # the scan is cached beside the run
    batches = take(mixed, mixed.batches_per_epoch)
    assert all(b["image"].shape == (12, 3, 16, 16) and b["size"].max() <= 16 for b in batches)
    assert (torch.cat([b["size"] for b in batches]).min(0).values < 16).all()  # non-square images: padded
    classes = [len(set(b["label"].tolist())) for b in batches]
    in_order = stream(url, tmp_path, shuffle_block=0, mix_shards=1)  # shard after shard, as stored
    classes_in_order = [len(set(b["label"].tolist())) for b in take(in_order, in_order.batches_per_epoch)]
    assert np.mean(classes_in_order) <= 1.5  # class-ordered shards read one by one: ~1 class per batch
    assert np.mean(classes) >= 4.0 and min(classes) >= 3, classes  # mixed across shards and shuffled
    assert sorted(k for b in batches for k in b["key"]) == sorted(
        f"c{c}-{i:03d}" for c in range(CLASSES) for i in range(PER_CLASS)
    )


@pytest.mark.slow
def test_two_rank_one_pass_sees_every_sample_exactly_once(served, tmp_path):
    _, base = served
    keys = []
    for rank in range(2):
        s = stream(f"{base}/{PATTERN}", tmp_path, rank=rank, world_size=2, num_workers=2, one_pass=True, batch_size=10)
        batches = list(s)
        assert len(batches) == s.batches_per_epoch
        keys += [k for b in batches for k in b["key"]]
    assert len(keys) == CLASSES * PER_CLASS and sorted(keys) == sorted(set(keys))


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
def test_stop_and_resume_mid_epoch_is_bit_identical(served, tmp_path, world):
    _, base = served
    kw = dict(world_size=world, num_workers=2, shuffle_block=20, mix_shards=3, batch_size=6)
    for rank in range(world):
        reference = stream(f"{base}/{PATTERN}", tmp_path, rank=rank, **kw)
        per_epoch = reference.batches_per_epoch
        want = take(reference, per_epoch + 4)
        for k in (3, per_epoch - 1):  # inside a shuffle block, and across the epoch boundary
            first = stream(f"{base}/{PATTERN}", tmp_path, rank=rank, **kw)
            take(first, k)
            buffer = io.BytesIO()
            torch.save(first.state_dict(), buffer)
            second = stream(f"{base}/{PATTERN}", tmp_path, rank=rank, **kw)
            second.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
            same_batches(take(second, 4), want[k : k + 4])


@pytest.mark.slow
def test_training_over_http_resumes_bit_identically_and_leaves_the_users_directory_unchanged(served, tmp_path):
    from eigtrain.train.command import compose_config, run

    directory, base = served
    before = tree_digest(directory)
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert run(compose_config(train_overrides(reference, f"{base}/{PATTERN}")))["step"] == 6
    assert run(compose_config(train_overrides(resumed, f"{base}/{PATTERN}", "stop_after=3")))["step"] == 3
    assert run(compose_config(train_overrides(resumed, f"{base}/{PATTERN}")))["step"] == 6
    assert losses(resumed) == losses(reference)
    assert_same_final_weights(resumed, reference)
    assert list((reference / "data").glob("shard-counts-*.json"))  # the count cache lives in the run

    local = tmp_path / "local"  # the same shards read as local files: the directory is not written to
    assert run(compose_config(train_overrides(local, str(directory / PATTERN), "steps=2")))["step"] == 2
    assert tree_digest(directory) == before


@pytest.mark.slow
def test_rayleigh_ritz_and_embeddings_of_a_run_trained_on_foreign_shards_read_every_sample_once(served, tmp_path):
    from safetensors.torch import load_file

    from eigtrain.export.command import main as rr_main
    from eigtrain.export.embed import embed_split, open_run
    from eigtrain.train.command import compose_config, run

    directory, base = served
    run_dir = tmp_path / "run"
    assert run(compose_config(train_overrides(run_dir, f"{base}/{PATTERN}", "steps=2")))["step"] == 2
    assert rr_main([f"run_dir={run_dir}", "num_workers=2"]) == 0  # the run's own shards, over HTTP again
    manifest = json.loads((run_dir / "rr" / "manifest.json").read_text())
    assert manifest["n"] == CLASSES * PER_CLASS
    assert load_file(str(run_dir / "rr" / "rr.safetensors"))["eigenvalues"].isfinite().all()
    z, labels = embed_split(open_run(run_dir), "train", batch_size=50, num_workers=2)
    assert len(z) == CLASSES * PER_CLASS and labels.bincount().tolist() == [PER_CLASS] * CLASSES


def test_demo_data_is_never_written_into_a_users_directory(served, tmp_path):
    from eigtrain.data.from_config import DataConfigError
    from eigtrain.schema import train_config
    from eigtrain.train.command import compose_config, prepare_data

    directory, _ = served
    before = tree_digest(directory)
    cfg = compose_config(["experiment=cpu_debug", f"data.root={directory}"])  # digits, write_if_missing=digits
    with pytest.raises(DataConfigError, match="only writes the demo shards into a new or empty directory"):
        prepare_data(train_config(cfg).data, 0)
    assert tree_digest(directory) == before


def test_shard_index_command_writes_a_wids_index_that_replaces_the_scan(served, tmp_path, capsys):
    directory, base = served
    out = tmp_path / "train.json"
    shards_cli(["index", f"{base}/{PATTERN}", f"out={out}"])
    assert json.loads(capsys.readouterr().out) == {"index": str(out), "shards": CLASSES, "samples": 144}
    index = json.loads(out.read_text())
    assert index["wids_version"] == 1 and index["shardlist"][0] == {"url": f"{base}/cls-000000.tar", "nsamples": 24}
    s = stream(f"{base}/{PATTERN}", tmp_path / "cache", shard_index=str(out))
    assert s.num_samples == 144 and not (tmp_path / "cache").exists()  # counts from the index: no scan

    copy = write_class_ordered(tmp_path / "copy", classes=2)  # default out: next to local shards, found there
    shards_cli(["index", str(copy / "cls-{000000..000001}.tar")])
    s = stream(str(copy / "cls-{000000..000001}.tar"), tmp_path / "cache2")
    assert s.num_samples == 48 and not (tmp_path / "cache2").exists()


def test_config_checks_name_the_key(tmp_path):
    from eigtrain.train.command import compose_config

    with pytest.raises(ConfigError, match="data.image_fit='sideways' is not allowed; allowed: cover, whole"):
        validate(compose_config(["experiment=cpu_debug", "data.image_fit=sideways"]), 1)
    with pytest.raises(ConfigError, match=r"give data.root \(an eigtrain shard directory\) or data.shards"):
        validate(compose_config(["experiment=cpu_debug", "data.root=null"]), 1)  # was a TypeError traceback
    with pytest.raises(ConfigError, match="data.shards needs data.image_size"):
        validate(compose_config(["experiment=cpu_debug", f"data.shards='{tmp_path}/a-{{0..1}}.tar'"]), 1)
    with pytest.raises(ConfigError, match="2 of the 2 shards of data.shards do not exist"):
        validate(
            compose_config(
                ["experiment=cpu_debug", f"data.shards='{tmp_path}/a-{{0..1}}.tar'", "data.image_size=[8,8]"]
            ),
            1,
        )


# ---------------------------------------------------------------------------------------------- GPU decode


def test_jpeg_decode_device_selection(monkeypatch):
    assert choose_jpeg_device("auto", "cpu") is None  # no CUDA: the workers decode
    assert choose_jpeg_device("cpu", "cpu") is None
    with pytest.raises(ValueError, match="data.decode=cuda needs .* the run is not on a CUDA device"):
        choose_jpeg_device("cuda", "cpu")
    with pytest.raises(ValueError, match="data.decode='gpu' is not allowed"):
        choose_jpeg_device("gpu", "cpu")
    monkeypatch.setattr(gpu_decode, "nvjpeg_problem", lambda device: None)  # the probe decode succeeded
    assert choose_jpeg_device("auto", "cuda:1") == torch.device("cuda:1")
    assert choose_jpeg_device("auto", "cuda:1", [224, 224]) == torch.device("cuda:1")
    assert choose_jpeg_device("auto", "cuda:1", [32, 32]) is None  # small images: the workers decode them faster
    assert choose_jpeg_device("cuda", "cuda:1", [32, 32]) == torch.device("cuda:1")  # cuda insists
    assert choose_jpeg_device("cpu", "cuda:1") is None


def test_batched_jpeg_decode_path_gives_the_workers_batches(served, tmp_path):
    """The nvJPEG code path, run on the CPU: same keys, labels, sizes; pixels within JPEG decoder rounding."""
    directory, _ = served
    url = str(directory / PATTERN)
    workers = take(stream(url, tmp_path, image_size=40), 4)  # no downscale: both decode at full size
    batched = take(stream(url, tmp_path, image_size=40, jpeg_device="cpu"), 4)
    for w, b in zip(workers, batched):
        assert w["key"] == b["key"] and torch.equal(w["label"], b["label"]) and torch.equal(w["size"], b["size"])
        assert (w["image"].float() - b["image"].float()).abs().mean() < 1.0


# ---------------------------------------------------------------------------------------------- bad input


def test_missing_shard_is_named_before_anything_runs(served, tmp_path):
    directory, base = served
    with pytest.raises(ShardError, match=r"shard .*cls-000009.tar does not exist"):
        stream([str(directory / PATTERN), str(directory / "cls-000009.tar")], tmp_path)
    with pytest.raises(ShardError, match=r"cannot open shard .*/cls-000006.tar: HTTP 404"):
        stream(f"{base}/cls-{{000004..000006}}.tar", tmp_path)


def test_unreachable_url_is_an_error_naming_it_and_counted_skips_when_counts_are_known(tmp_path):
    port = free_port()  # a port nobody listens on
    url = f"http://127.0.0.1:{port}/x-{{0..1}}.tar"
    with pytest.raises(ShardError, match=f"cannot reach shard http://127.0.0.1:{port}/x-0.tar"):
        stream(url, tmp_path, io_timeout_s=5)
    index = tmp_path / "index.json"  # counts known from an index: the read fails, each sample a counted skip
    index.write_text(
        json.dumps(
            {
                "wids_version": 1,
                "shardlist": [{"url": f"http://127.0.0.1:{port}/x-{i}.tar", "nsamples": 12} for i in range(2)],
            }
        )
    )
    s = stream(url, tmp_path, shard_index=str(index), max_corrupt=5, io_timeout_s=5, batch_size=4)
    with pytest.raises(
        CorruptDataError,
        match=f"6 unusable samples .*more than max_corrupt=5; the last: shard "
        f"http://127.0.0.1:{port}/x-.\\.tar, .*cannot reach shard",
    ):
        take(s, 6)


def test_truncated_tar_is_named_by_the_scan_and_counted_when_indexed(tmp_path):
    shard = write_shard(tmp_path / "t-1.tar", good_samples("t1", 12))
    write_shard(tmp_path / "t-0.tar", good_samples("t0", 12))
    whole = shard.read_bytes()
    shard.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ShardError, match=r"shard .*t-1.tar cannot be read to its end after \d+ samples"):
        stream(str(tmp_path / "t-{0..1}.tar"), tmp_path / "cache")
    index = tmp_path / "wids-index.json"  # written before the damage, as `eigtrain-shards index` would have
    index.write_text(
        json.dumps(
            {"wids_version": 1, "shardlist": [{"url": "t-0.tar", "nsamples": 12}, {"url": "t-1.tar", "nsamples": 12}]}
        )
    )
    s = stream(str(tmp_path / "t-{0..1}.tar"), tmp_path / "cache", batch_size=4, max_corrupt=12, shuffle_block=0)
    keys = [k for b in take(s, s.batches_per_epoch) for k in b["key"]]
    assert s.batches_per_epoch == 6 and 0 < s.corrupt_count == 24 - len(keys) <= 12  # short batches, not a short epoch
    strict = stream(str(tmp_path / "t-{0..1}.tar"), tmp_path / "cache", batch_size=4, max_corrupt=0, shuffle_block=0)
    with pytest.raises(CorruptDataError, match=r"the last: shard .*t-1.tar, key sample #\d+ .*not readable"):
        take(strict, 6)


@pytest.mark.parametrize("jpeg_device", [None, "cpu"], ids=["worker-decode", "batched-decode"])
def test_undecodable_image_is_a_counted_skip_naming_shard_and_key(tmp_path, jpeg_device):
    samples = good_samples("u", 12)
    samples[5]["jpg"] = b"\xff\xd8 not really a jpeg"
    write_shard(tmp_path / "u-0.tar", samples)
    s = stream(
        str(tmp_path / "u-0.tar"),
        tmp_path / "cache",
        batch_size=6,
        max_corrupt=1,
        shuffle_block=0,
        jpeg_device=jpeg_device,
    )
    batches = take(s, 2)
    assert [len(b["key"]) for b in batches] == [5, 6] and s.corrupt_count == 1
    strict = stream(
        str(tmp_path / "u-0.tar"),
        tmp_path / "cache",
        batch_size=6,
        max_corrupt=0,
        shuffle_block=0,
        jpeg_device=jpeg_device,
    )
    with pytest.raises(CorruptDataError, match=r"the last: shard .*u-0.tar, key u-05: "):
        take(strict, 1)


def test_sample_without_the_image_member_names_shard_key_and_what_it_has(tmp_path):
    samples = good_samples("m", 8)
    samples[2] = {"__key__": "m-02", "txt": "a caption", "cls": 0}
    write_shard(tmp_path / "m-0.tar", samples)
    s = stream(str(tmp_path / "m-0.tar"), tmp_path / "cache", batch_size=8, max_corrupt=0, image_key="jpg;png")
    with pytest.raises(
        CorruptDataError,
        match=r"shard .*m-0.tar, key m-02: KeyError: .no image member "
        r"jpg\|png; the sample has \['cls', 'txt'\]",
    ):
        take(s, 1)


def test_label_from_a_json_field(tmp_path):
    samples = good_samples("j", 4)
    for i, sample in enumerate(samples):
        del sample["cls"]
        sample["json"] = json.dumps({"meta": {"label": 10 + i}}).encode()
    write_shard(tmp_path / "j-0.tar", samples)
    batch = take(
        stream(str(tmp_path / "j-0.tar"), tmp_path / "c", batch_size=4, label_key="json:meta.label", shuffle_block=0), 1
    )[0]
    assert batch["label"].tolist() == [10, 11, 12, 13]


@pytest.mark.slow
def test_two_rank_training_over_http_stops_and_resumes_bit_identically(served, tmp_path):
    """DDP on 2 CPU processes under torchrun (gloo): the whole run, then a stop at N/2 and a resume, are the same
    losses and weights bit for bit (the suite's one DDP train + resume path; DeepSpeed's is in tests/train)."""
    from eigtrain.runs import checkpoint as ckpt
    from eigtrain.train.metrics_log import read_metrics

    _, base = served
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    check(torchrun(tmp_path, ["-m", "eigtrain.train.command"], *train_overrides(reference, f"{base}/{PATTERN}")))
    records = read_metrics(reference)
    assert [r["step"] for r in records] == list(range(1, 7)) and all(r["loss"] is not None for r in records)
    step6 = reference / "checkpoints/step-6"  # torch DCP shards of both ranks beside each rank's trainer state
    assert {"__0_0.distcp", "__1_0.distcp", "rank-0.pt", "rank-1.pt", ckpt.MARKER} <= {p.name for p in step6.iterdir()}
    check(
        torchrun(
            tmp_path, ["-m", "eigtrain.train.command"], *train_overrides(resumed, f"{base}/{PATTERN}", "stop_after=3")
        )
    )
    assert ckpt.latest_checkpoint(resumed / "checkpoints") == resumed / "checkpoints/step-3"
    check(torchrun(tmp_path, ["-m", "eigtrain.train.command"], *train_overrides(resumed, f"{base}/{PATTERN}")))
    assert len(losses(reference)) == 6 and losses(resumed) == losses(reference)
    assert_same_final_weights(resumed, reference)


def test_login_node_check_of_the_readme_imagenette_job(tmp_path):
    """38 shards of 250 on 4 x 8 GPUs with 6 workers each (192 reader slots): runs (workers share shards) unless
    a slot gets less than one batch, which fails before submission with the numbers."""
    from eigtrain.train.command import compose_config

    pattern = "http://127.0.0.1:9/in-{000000..000037}.tar"  # never contacted: the counts come from the index
    index = tmp_path / "in.json"
    index.write_text(
        json.dumps(
            {
                "wids_version": 1,
                "shardlist": [{"url": f"http://127.0.0.1:9/in-{i:06d}.tar", "nsamples": 250} for i in range(38)],
            }
        )
    )
    job = [
        "experiment=cpu_debug",
        f"data.shards='{pattern}'",
        f"data.shard_index={index}",
        "data.image_size=[8,8]",
        "data.augment=imagenet",  # the job's (experiment=imagenette_vicreg); digits' one value is refused on RGB
        "data.num_workers=6",
    ]
    validate(compose_config([*job, "batch_size=256"]), 32)  # 8 per rank: 49 samples per slot are enough
    with pytest.raises(
        ConfigError,
        match=r"has 9500 samples, fewer than one batch per reader slot: world_size x "
        r"num_workers x per-rank batch = 32 x 6 x 64; lower data.num_workers",
    ):
        validate(compose_config([*job, "batch_size=2048"]), 32)


def test_a_network_read_that_fails_midway_is_reopened_where_it_stopped(served, tmp_path):
    directory, _ = served
    failed = set()

    class FailsOnceMidway(QuietHandler):
        def do_GET(self):
            if self.path in failed:
                return super().do_GET()
            failed.add(self.path)
            data = (directory / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])  # then the connection drops
            self.close_connection = True

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(FailsOnceMidway, directory=str(directory))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        index = tmp_path / "index.json"  # counts known: the first read of every shard is the training read
        index.write_text(
            json.dumps(
                {
                    "wids_version": 1,
                    "shardlist": [{"url": f"{base}/cls-{i:06d}.tar", "nsamples": PER_CLASS} for i in range(CLASSES)],
                }
            )
        )
        s = stream(f"{base}/{PATTERN}", tmp_path, shard_index=str(index), max_corrupt=0)
        keys = [k for b in take(s, s.batches_per_epoch) for k in b["key"]]
        assert len(failed) == CLASSES and s.corrupt_count == 0  # every shard failed once, nothing was lost
        assert sorted(keys) == sorted(f"c{c}-{i:03d}" for c in range(CLASSES) for i in range(PER_CLASS))
    finally:
        server.shutdown()
        server.server_close()


def test_pairs_mode_with_configured_member_names(tmp_path):
    rng = np.random.default_rng(2)
    samples = []
    for i in range(6):
        buffer = io.BytesIO()
        np.save(buffer, np.full(3, i, np.float32))
        samples.append({"__key__": f"p-{i}", "input.jpg": jpeg(i, rng), "context.npy": buffer.getvalue(), "cls": i})
    write_shard(tmp_path / "p-0.tar", samples)
    options = dict(
        mode="pairs",
        x_key="input.jpg",
        a_key="context.npy",
        label_key="cls",
        image_size=8,
        batch_size=6,
        num_workers=0,
        shuffle_block=0,
        cache_dir=tmp_path / "c",
    )
    s = open_stream(shards=str(tmp_path / "p-0.tar"), **options)
    batch = take(s, 1)[0]
    assert batch["x"].shape == (6, 3, 8, 8) and batch["a"].dtype == torch.float32
    assert batch["a"][:, 0].tolist() == batch["label"].float().tolist()  # x, a and the label stay together


@pytest.mark.parametrize("jpeg_device", [None, "cpu"], ids=["workers", "batched"])
def test_an_image_over_the_pixel_budget_is_a_counted_skip_never_decoded(tmp_path, jpeg_device):
    """issue 52: three small PNGs of 15,000 x 15,000 pixels were decoded (+500 MB each). Over data.max_image_pixels
    an image is unusable before any decode: skipped, counted, named past max_corrupt."""
    from PIL import Image

    big = io.BytesIO()
    Image.new("L", (15000, 15000)).save(big, format="PNG")  # ~220 KB of zeros, 225 M pixels
    samples = good_samples("p", 8)
    samples[5] = {"__key__": "p-05", "png": big.getvalue(), "cls": 0}
    write_shard(tmp_path / "p-0.tar", samples)

    def budget(**kw):
        shard = str(tmp_path / "p-0.tar")
        common = dict(batch_size=8, image_key="jpg;png", shuffle_block=0, jpeg_device=jpeg_device, image_size=[8, 8])
        return stream(shard, tmp_path / "cache", **common, **kw)

    s = budget()
    assert [len(b["key"]) for b in take(s, 1)] == [7] and s.corrupt_count == 1
    strict = budget(max_corrupt=0, max_image_pixels=10**6)
    with pytest.raises(CorruptDataError, match=r"key p-05: ValueError: an image of 225,000,000 pixels, over data"):
        take(strict, 1)
