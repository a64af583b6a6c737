"""Fixtures shared by the test areas (tests/<area>/test_*.py); helpers that are not fixtures live in tests/support/."""

import os

import numpy as np
import pytest
import webdataset as wds
from sklearn.datasets import load_digits

from eigtrain.data.write import main as write_shards_cli

# slurm_cluster: a real single-node Slurm cluster, started on first use
pytest_plugins = ["tests.support.slurm_fixture"]

FOREIGN_SAMPLES = 480


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    """eigtrain's own shards of sklearn's digits (200 samples a shard), written once per session."""
    root = tmp_path_factory.mktemp("digits")
    write_shards_cli(["source=digits", f"out={root}", "shard_size=200"])
    return root


@pytest.fixture(scope="session")
def foreign_shards(tmp_path_factory):
    """480 RGB 16x16 digit images as jpg + cls, 4 shards of 120, written by webdataset.ShardWriter."""
    root = tmp_path_factory.mktemp("foreign")
    images, labels = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "part-%06d.tar"), maxcount=120, verbose=0) as sink:
        for i in range(FOREIGN_SAMPLES):
            gray = np.kron((images[i].reshape(8, 8) * 16).clip(0, 255), np.ones((2, 2)))[..., None]
            sink.write(
                {
                    "__key__": f"img{i:05d}",
                    "jpg": (gray * rng.uniform(0.6, 1.0, 3)).astype(np.uint8),
                    "cls": int(labels[i]),
                }
            )
    assert sorted(os.listdir(root)) == [f"part-{i:06d}.tar" for i in range(4)]
    return str(root / "part-{000000..000003}.tar")
