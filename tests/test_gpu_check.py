"""tools/gpu_check.sh on a machine without CUDA: says so, does its CPU dry run, exits 0."""

import subprocess
import sys

import pytest

from tests.test_train_support import REPO, clean_env


@pytest.mark.slow
def test_gpu_check_without_cuda_says_so_and_passes_its_cpu_dry_run(tmp_path):
    env = {**clean_env(), "PYTHON": sys.executable, "OUT_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA device visible" in done.stdout and "CPU dry run OK" in done.stdout
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.count("PASS") == 3 and "FAIL" not in summary  # stop/resume (bit for bit), eigtrain-rr, bench
