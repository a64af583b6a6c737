"""eigtrain-rr embeddings=, the command's fixed costs (issue 53): the files' hash (the manifest's provenance) starts
before torch is imported and is the hash the manifest records (the import leaves a core idle); the command line is
composed once; the pass leaves torch's thread count as it found it; the console script's process skips the
interpreter's last collections."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from eigtrain.runs.checksums import file_sha256, files_sha256, hash_ahead, path_sha256

SPY = """
import sys
import eigtrain.runs.checksums as checksums
first = checksums.hash_ahead
seen = []
checksums.hash_ahead = lambda path: (seen.append("torch" in sys.modules), first(path))
import eigtrain.export.rr_config as rr_config
compose, parsed = rr_config.compose_dataclass, []  # what parse_args calls, wherever it is called from
rr_config.compose_dataclass = lambda *a: (parsed.append(1), compose(*a))[1]
from eigtrain.commands import rr
code = rr(sys.argv[1:])
print("SEEN", seen, "PARSED", len(parsed))
sys.exit(code)
"""


def test_the_hash_starts_before_torch_and_is_the_one_recorded(tmp_path):
    rng = np.random.default_rng(0)
    source = tmp_path / "pairs.npz"
    np.savez(source, z1=rng.standard_normal((64, 4)), z2=rng.standard_normal((64, 4)))
    out = tmp_path / "rr"
    proc = subprocess.run(
        [sys.executable, "-c", SPY, f"embeddings={source}", f"out={out}"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SEEN [False]" in proc.stdout  # called once, torch not yet imported
    assert "PARSED 1" in proc.stdout  # the checked configuration is the one the command runs
    recorded = json.loads((out / "manifest.json").read_text())["source"]["sha256"]
    assert recorded == hashlib.sha256(source.read_bytes()).hexdigest()


def test_a_hash_started_ahead_is_taken_once_and_equals_the_direct_one(tmp_path):
    (tmp_path / "d").mkdir()
    for name in ("a.npy", "b.npy"):
        (tmp_path / "d" / name).write_bytes(name.encode() * 1000)
    for path, direct in ((tmp_path / "d", files_sha256), (tmp_path / "d" / "a.npy", file_sha256)):
        hash_ahead(path)
        assert path_sha256(path) == direct(path)
        (tmp_path / "d" / "a.npy").write_bytes(b"changed")  # taken once: the next call hashes the file as it is now
        assert path_sha256(path) == direct(path)


def test_an_error_ahead_is_raised_where_the_hash_is_taken(tmp_path):
    missing = tmp_path / "gone.npz"
    hash_ahead(missing)
    with pytest.raises(FileNotFoundError):
        path_sha256(missing)


def test_a_hash_started_again_replaces_one_never_taken(tmp_path):
    """A command that stopped before reading its files leaves its hash untaken; the next one hashes them anew."""
    path = tmp_path / "pairs.npz"
    path.write_bytes(b"first")
    hash_ahead(path)
    path.write_bytes(b"second")
    hash_ahead(path)
    assert path_sha256(path) == hashlib.sha256(b"second").hexdigest()


def test_the_pass_leaves_torch_threads_as_it_found_them(tmp_path):
    import torch

    from eigtrain.export.command import main

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "pairs.npz", z1=rng.standard_normal((64, 4)), z2=rng.standard_normal((64, 4)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main([f"embeddings={tmp_path / 'pairs.npz'}", f"out={tmp_path / 'rr'}"]) == 0
        assert torch.get_num_threads() == 2  # one while the moments were summed (eigtrain.export.command)
    finally:
        torch.set_num_threads(before)


def test_the_console_script_freezes_what_its_process_ends_with(tmp_path, monkeypatch):
    import gc

    from eigtrain.commands import rr

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "pairs.npz", z1=rng.standard_normal((64, 4)), z2=rng.standard_normal((64, 4)))
    args = [f"embeddings={tmp_path / 'pairs.npz'}"]
    gc.unfreeze()
    try:
        assert rr([*args, f"out={tmp_path / 'called'}"]) == 0 and gc.get_freeze_count() == 0  # a caller's process
        monkeypatch.setattr(sys, "argv", ["eigtrain-rr", *args, f"out={tmp_path / 'script'}"])
        assert rr() == 0 and gc.get_freeze_count() > 0  # the console script's: it ends next
    finally:
        gc.unfreeze()
