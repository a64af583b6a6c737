"""s3:// shards on a real S3 API server (moto's, on 127.0.0.1, started here), read through fsspec/s3fs like any
other URL: brace pattern, counts from one scan, one pass over 2 ranks sees every sample once, a short training
run, and a missing object named in one message."""

import logging
import os

import pytest

from eigtrain.data import ShardError
from tests.support.foreign_shards import CLASSES, PATTERN, PER_CLASS, train_overrides, write_class_ordered
from tests.support.streams import open_stream

boto3 = pytest.importorskip("boto3")
s3fs = pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """s3://data/shards/<class-ordered shards> on a local S3 server; the environment points every client at it."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()  # a filesystem cached by an earlier test would keep its old endpoint
    client = boto3.client("s3")
    client.create_bucket(Bucket="data")
    for path in sorted(write_class_ordered(tmp_path_factory.mktemp("upload")).glob("*.tar")):
        client.upload_file(str(path), "data", f"shards/{path.name}")
    yield "s3://data/shards"
    for key, value in saved.items():
        os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    server.stop()


def one_pass_keys(url, cache, rank=0, world_size=1):
    options = dict(
        batch_size=12,
        num_workers=2,
        rank=rank,
        world_size=world_size,
        label_key="cls",
        image_size=16,
        image_fit="whole",
        cache_dir=cache,
        one_pass=True,
    )
    s = open_stream(shards=url, **options)
    return [k for batch in s for k in batch["key"]], s.num_samples


def test_two_rank_one_pass_over_s3_sees_every_sample_exactly_once(bucket, tmp_path):
    (first, total), (second, _) = (one_pass_keys(f"{bucket}/{PATTERN}", tmp_path, r, 2) for r in (0, 1))
    assert total == CLASSES * PER_CLASS
    assert len(first) + len(second) == total and len(set(first) | set(second)) == total


@pytest.mark.slow
def test_training_reads_s3_shards(bucket, tmp_path):
    from eigtrain.train.command import compose_config, run

    assert run(compose_config(train_overrides(tmp_path / "run", f"{bucket}/{PATTERN}", "steps=2")))["step"] == 2


def test_a_missing_object_is_named(bucket, tmp_path):
    with pytest.raises(ShardError, match=r"s3://data/shards/cls-000006.tar"):
        one_pass_keys(f"{bucket}/cls-{{000005..000006}}.tar", tmp_path)
