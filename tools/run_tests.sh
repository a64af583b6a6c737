#!/usr/bin/env bash
# Set everything up on a fresh machine (Python venv, the package with its dev extra, the local Slurm
# cluster's Debian packages) and run the whole test suite. This is the command .ci/run runs.
# Arguments go to pytest: `bash tools/run_tests.sh -m "not slow"` is the quick loop, `tests/data` one area.
# Two pytest-xdist workers, each taking whole test files (module fixtures are built once): many tests wait on a
# subprocess, a Slurm job or a server with a core idle, which the other worker fills; `-n 0` runs in one process.
# Files start heaviest first (tests/conftest.py orders them; xdist's own reorder by test count would start the
# long end-to-end files last).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/venv.sh
venv_install '[dev]'
# Debian's Fashion-MNIST idx files: tests/data/test_idx_source.py trains on the real format (with CI set, it must)
install_fashion_mnist() {
  [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && return
  export DEBIAN_FRONTEND=noninteractive
  local install=(apt-get install -y -qq --no-install-recommends dataset-fashion-mnist)
  "${install[@]}" >&2 || { apt-get update -qq >&2 && "${install[@]}" >&2; }  # stale package lists: update once
}
if command -v apt-get >/dev/null; then
  bash tools/slurm_local.sh install  # scontrol before the tests that use it
  install_fashion_mnist
fi
exec .venv/bin/python -m pytest -q --durations=15 -rs -n 2 --dist loadfile --no-loadscope-reorder "$@"
