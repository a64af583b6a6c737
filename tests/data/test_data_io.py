"""Reads of remote shards: every read bounded by data.io_timeout_s (http, pipe:, s3:// through fsspec, the
DataLoader), permanent failures (404, 403) never retried, passing ones (5xx, a reset) retried with backoff, and the
shard-count cache keyed on what the store says identifies an upload (ETag / Last-Modified / size).

Real components only: shards on disk, `tests.support.fault_server.FaultServer` on 127.0.0.1, real shell commands."""

import json
import os
import shlex
import sys
import time

import pytest

from eigtrain.data import ShardError
from eigtrain.data.sample_counts import shard_counts
from eigtrain.data.shards import count_samples, open_url
from tests.support.fault_server import FaultServer
from tests.support.foreign_shards import good_samples, write_shard
from tests.support.streams import open_stream

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]


@pytest.fixture
def shards(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    for i in range(2):
        write_shard(directory / f"s-{i}.tar", good_samples(f"s{i}", 6))
    return directory


@pytest.fixture
def server(shards):
    with FaultServer(shards) as running:
        yield running


def stream(url, cache, **kw):
    args = dict(batch_size=3, num_workers=0, label_key="cls", image_size=8, cache_dir=cache, shuffle_block=0)
    return open_stream(shards=url, **{**args, **kw})


def wids_index(path, urls, n=6):
    path.write_text(json.dumps({"wids_version": 1, "shardlist": [{"url": u, "nsamples": n} for u in urls]}))
    return str(path)


# ---------------------------------------------------------------------------------------------- bounded reads


def test_a_stalled_pipe_command_is_a_timeout_naming_it(shards):
    half = (shards / "s-0.tar").stat().st_size // 2
    url = f"pipe:head -c {half} {shlex.quote(str(shards / 's-0.tar'))}; sleep 300"
    start = time.monotonic()
    with pytest.raises(
        ShardError,
        match=r"shard pipe:head .* cannot be read to its end .*TimeoutError: no answer "
        r"from pipe:head .* within 0.5 s \(data.io_timeout_s\)",
    ):
        count_samples(url, timeout_s=0.5)
    assert time.monotonic() - start < 15  # 3 bounded reads and their backoff, not 300 s


def test_a_pipe_command_that_fails_midway_is_not_a_complete_shard(shards):
    half = (shards / "s-0.tar").stat().st_size // 2
    url = f"pipe:head -c {half} {shlex.quote(str(shards / 's-0.tar'))}; exit 22"
    with pytest.raises(ShardError, match=r"cannot be read to its end .*exited with status 22"):
        count_samples(url, timeout_s=5)
    assert count_samples(f"pipe:cat {shlex.quote(str(shards / 's-0.tar'))}", timeout_s=5) == 6


def test_an_object_store_that_does_not_answer_is_a_timeout_naming_the_url(monkeypatch, shards):
    pytest.importorskip("s3fs")
    with FaultServer(shards) as mute:
        mute.faults["*"] = ["mute"]
        monkeypatch.setenv("AWS_ENDPOINT_URL", mute.url("").rstrip("/"))
        for key, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            monkeypatch.setenv(key, value)
        start = time.monotonic()
        with pytest.raises(ShardError, match=r"no answer from s3://bucket/s-0.tar within 0.5 s \(data.io_timeout_s\)"):
            open_url("s3://bucket/s-0.tar", timeout_s=0.5)
        assert time.monotonic() - start < 15
    # s3fs caches its filesystems by arguments, not by the endpoint read from the environment: drop this one so that
    # later tests (test_data_object_store's S3 server) do not reuse a client pointed at this stopped server
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def test_a_data_worker_that_delivers_nothing_ends_with_one_timeout_line(shards, tmp_path):
    """A source that trickles (every read answers, the batch never completes) is bounded by the DataLoader."""
    out = "sys.stdout.buffer"
    trickle = (
        f'{sys.executable} -c "import sys,time; [({out}.write(bytes([b])), {out}.flush(), time.sleep(0.05)) '
        f"for b in open({str(shards / 's-0.tar')!r},'rb').read()]\""
    )
    url = f"pipe:{trickle}"
    s = stream(
        [url],
        tmp_path,
        num_workers=1,
        mix_shards=1,
        io_timeout_s=0.5,
        shard_index=wids_index(tmp_path / "i.json", [url]),
    )
    with pytest.raises(TimeoutError, match=r"the data workers of data.shards .* delivered no batch for 2.5 s"):
        next(iter(s))


# ---------------------------------------------------------------------------------------------- retries


@pytest.mark.parametrize("status", ["404", "403"])
def test_a_missing_or_forbidden_shard_is_never_retried(server, tmp_path, status):
    server.faults["/s-1.tar"] = [status]
    urls = [server.url("s-0.tar"), server.url("s-1.tar")]
    with pytest.raises(ShardError, match=rf"cannot open shard .*/s-1.tar: HTTP {status}"):
        shard_counts(urls, tmp_path)
    assert server.gets("s-1.tar") == 1
    s = stream(urls, tmp_path, max_corrupt=6, shard_index=wids_index(tmp_path / "i.json", urls))
    keys = [k for _, batch in zip(range(4), s) for k in batch["key"]]
    assert len(keys) == 6 and s.corrupt_count == 6  # the 6 samples of s-1 are counted skips after one GET
    assert server.gets("s-1.tar") == 2


@pytest.mark.parametrize("faults", [["500", "ok"], ["503", "503", "ok"], ["reset", "ok"], ["stall", "ok"]])
def test_a_failure_that_may_pass_is_retried_with_backoff(server, tmp_path, faults):
    server.faults["/s-1.tar"] = list(faults)
    urls = [server.url("s-0.tar"), server.url("s-1.tar")]
    assert shard_counts(urls, tmp_path, timeout_s=0.5) == [6, 6]
    assert server.gets("s-1.tar") == len(faults)


def test_a_failure_that_does_not_pass_ends_naming_the_shard(server, tmp_path):
    server.faults["/s-1.tar"] = ["500"]
    with pytest.raises(ShardError, match=r"cannot open shard .*/s-1.tar: HTTP 500"):
        shard_counts([server.url("s-0.tar"), server.url("s-1.tar")], tmp_path)
    assert server.gets("s-1.tar") == 3  # the first try and OPEN_RETRIES more


# ---------------------------------------------------------------------------------------------- count cache


def test_a_reuploaded_shard_is_counted_again(server, shards, tmp_path):
    urls = [server.url("s-0.tar"), server.url("s-1.tar")]
    assert shard_counts(urls, tmp_path) == [6, 6]
    assert shard_counts(urls, tmp_path) == [6, 6] and server.gets("s-0.tar") == 1  # cached: no second read
    write_shard(shards / "s-0.tar", good_samples("new", 9))  # re-uploaded under the same URL
    assert shard_counts(urls, tmp_path) == [9, 6]
    assert server.gets("s-0.tar") == 2


def test_a_rewritten_local_shard_of_the_same_size_is_counted_again(shards, tmp_path):
    urls = [str(shards / "s-0.tar")]
    assert shard_counts(urls, tmp_path) == [6]
    stat = (shards / "s-0.tar").stat()
    write_shard(shards / "s-0.tar", good_samples("s0", 6))  # the same bytes, written again
    os.utime(shards / "s-0.tar", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache = next(tmp_path.glob("shard-counts-*.json"))
    cached = json.loads(cache.read_text())
    cached["counts"] = [5]  # what a stale entry would say
    cache.write_text(json.dumps(cached))
    assert shard_counts(urls, tmp_path) == [6]
