"""eigtrain.safe_files: whole files or none, never through a planted link, a full disk as one line."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from eigtrain.safe_files import OutputError, atomic_open, make_dir, write_bytes, write_text, write_with


def test_a_link_at_the_target_is_replaced_and_its_victim_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    target = tmp_path / "out" / "table.md"
    target.parent.mkdir()
    target.symlink_to(victim)
    write_text(target, "report\n")
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_text() == "report\n"


def test_a_dangling_link_at_the_target_creates_nothing_at_its_destination(tmp_path):
    target = tmp_path / "config.yaml"
    target.symlink_to(tmp_path / "elsewhere")
    write_bytes(target, b"x")
    assert not (tmp_path / "elsewhere").exists() and target.read_bytes() == b"x"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["f.json"]


def test_write_with_hands_a_path_to_library_writers_and_sets_the_mode(tmp_path):
    target = tmp_path / "weights.bin"
    write_with(target, lambda tmp: tmp.write_bytes(b"abc"), file_mode=0o600)
    assert target.read_bytes() == b"abc" and (target.stat().st_mode & 0o777) == 0o600
    assert os.listdir(tmp_path) == ["weights.bin"]


def test_make_dir_refuses_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "eval").symlink_to(tmp_path / "real")
    with pytest.raises(OutputError, match="symbolic link"):
        make_dir(tmp_path / "eval")
    assert make_dir(tmp_path / "a" / "b").is_dir()


def test_a_file_size_limit_is_one_line_and_leaves_nothing(tmp_path):
    code = (
        "import resource, sys\n"
        "from eigtrain.safe_files import write_bytes\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))\n"
        "try:\n"
        f"    write_bytes({str(tmp_path / 'big')!r}, b'x' * 100_000)\n"
        "except OSError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "file size limit" in done.stdout and str(tmp_path / "big") in done.stdout
    assert os.listdir(tmp_path) == []
    assert resource.getrlimit(resource.RLIMIT_FSIZE)  # the limit was set in the child only
