"""Fixtures shared by the test areas (tests/<area>/test_*.py); helpers that are not fixtures live in tests/support/."""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from sklearn.datasets import load_digits

from eigtrain.data.write import main as write_shards_cli

# slurm_cluster: a real single-node Slurm cluster, started on first use
pytest_plugins = ["tests.support.slurm_fixture"]

FOREIGN_SAMPLES = 480
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")  # EIGTRAIN_FILE_SECONDS=1 bash tools/run_tests.sh


def pytest_collection_modifyitems(items):
    """The longest files first, so that no long end-to-end file starts last on one xdist worker while the other
    idles (tools/run_tests.sh runs with --no-loadscope-reorder, which keeps this order; xdist's own reorder, by test
    count, starts them last). Seconds per file as last measured; a file not measured counts 20 s a slow test."""
    measured = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    guess: dict[str, float] = {}
    for item in items:
        guess[item.location[0]] = guess.get(item.location[0], 0.0) + (20.0 if item.get_closest_marker("slow") else 0.1)
    order = {path: i for i, path in enumerate(guess)}
    items.sort(key=lambda item: (-measured.get(item.location[0], guess[item.location[0]]), order[item.location[0]]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With EIGTRAIN_FILE_SECONDS=1, each test's wall seconds (setup to teardown), one line per test."""
    start = time.monotonic()
    yield
    if os.environ.get("EIGTRAIN_FILE_SECONDS"):
        with open(FILE_SECONDS.with_suffix(".jsonl"), "a") as sink:
            sink.write(json.dumps([item.location[0], time.monotonic() - start]) + "\n")


def pytest_sessionfinish(session):
    """With EIGTRAIN_FILE_SECONDS=1, the controller (not an xdist worker) sums the lines per file into file_seconds.json."""
    lines = FILE_SECONDS.with_suffix(".jsonl")
    if not os.environ.get("EIGTRAIN_FILE_SECONDS") or hasattr(session.config, "workerinput") or not lines.exists():
        return
    totals: dict[str, float] = {}  # the files this run measured replace theirs; the others keep theirs
    for path, seconds in map(json.loads, lines.read_text().splitlines()):
        totals[path] = totals.get(path, 0.0) + seconds
    kept = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
    kept.update({p: round(t, 1) for p, t in totals.items()})
    FILE_SECONDS.write_text(json.dumps(dict(sorted(kept.items())), indent=0) + "\n")
    lines.unlink()


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
