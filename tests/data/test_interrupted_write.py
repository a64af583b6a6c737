"""An interrupted write of eigtrain's own shards (eigtrain-shards, or the trainer's demo-data write, killed midway) is
recognised by the marker eigtrain writes first and removes last, and written again; a directory holding anything
eigtrain did not write is still refused, untouched."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from eigtrain.data.index import INDEX_NAME
from eigtrain.data.write import write_shards

KILLED_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    from eigtrain.data.sources import digits_source
    from eigtrain.data.write import write_shards

    def killed_after(samples, n):
        for i, sample in enumerate(samples):
            if i == n:
                os.kill(os.getpid(), signal.SIGKILL)  # as `kill -9` or the OOM killer would, mid-shard
            yield sample

    source = digits_source()
    write_shards(sys.argv[1], {"train": killed_after(source.splits["train"], 450)}, shard_size=200)
    """
)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A digits write killed (SIGKILL) in its third shard: two shards, a .tmp, the marker, no index (written once)."""
    root = tmp_path_factory.mktemp("killed") / "digits"
    out = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(root)], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert not (root / INDEX_NAME).exists() and len(list(root.iterdir())) >= 2  # shards, a .tmp, no index
    return root


def _killed_write(killed, root):
    shutil.copytree(killed, root)


@pytest.mark.slow  # a trainer after a real SIGKILL
def test_a_killed_demo_data_write_is_written_again_by_the_trainer(killed, tmp_path):
    from eigtrain.train.command import main

    root = tmp_path / "digits"
    _killed_write(killed, root)
    argv = sys.argv
    sys.argv = [
        "eigtrain-train",
        "experiment=cpu_debug",
        f"run_dir={tmp_path / 'run'}",
        f"data.root={root}",
        "steps=1",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "data.num_workers=0",
    ]
    try:
        main()
    finally:
        sys.argv = argv
    assert (root / INDEX_NAME).is_file() and (tmp_path / "run" / "model.safetensors").is_file()
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".eigtrain")]


def test_a_killed_write_is_written_again_by_eigtrain_shards(killed, tmp_path):
    from eigtrain.data.write import main

    root = tmp_path / "digits"
    _killed_write(killed, root)
    main(["source=digits", f"out={root}", "shard_size=200"])
    assert (root / INDEX_NAME).is_file()


def test_a_killed_write_beside_a_users_file_is_refused_and_nothing_is_removed(killed, tmp_path):
    root = tmp_path / "digits"
    _killed_write(killed, root)
    (root / "notes.txt").write_text("mine")
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(FileExistsError, match="notes.txt"):
        write_shards(root, {"train": []})
    assert sorted(p.name for p in root.iterdir()) == before


def test_a_directory_of_shards_eigtrain_did_not_write_is_still_refused(tmp_path):
    root = tmp_path / "theirs"
    root.mkdir()
    (root / "train-000000.tar").write_bytes(b"their shard")
    with pytest.raises(FileExistsError, match="holds no eigtrain shards"):
        write_shards(root, {"train": []})
    assert (root / "train-000000.tar").read_bytes() == b"their shard"


def test_a_write_still_running_is_not_taken_for_an_interrupted_one(tmp_path):
    from eigtrain.data import write_marker

    root = tmp_path / "digits"
    root.mkdir()
    write_marker.begin(root)  # this process: alive
    (root / "train-000000.tar").write_bytes(b"being written")
    with pytest.raises(FileExistsError, match=f"pid {os.getpid()}"):
        write_shards(root, {"train": []})
    assert (root / "train-000000.tar").exists()
