#!/usr/bin/env bash
# GPU day one in one go, on a machine with no network (the kit: tools/gpu_check.py, gpu_check_steps.py,
# bench_gpu.py, offline_install.py; wheels from tools/device_wheels.sh, run where PyPI is reachable):
#
#   bash tools/gpu_check.sh --dry-run        # list every step with its time box; CPU dry run of the plumbing
#   bash tools/gpu_check.sh --part 1         # on the GPU: install + (a) training + (b) bench_gpu   (<= 10 min)
#   bash tools/gpu_check.sh --part 2         # (c) host syncs, (d) stop/resume, (e) ZeRO-2/3, (f) rr + eval,
#                                            # (g) 1-rank NCCL + SyncBatchNorm + DDP             (<= 10 min)
#   bash tools/gpu_check.sh                  # both parts (<= 20 min)
#   bash tools/gpu_check.sh --part 4 --steps q_fashion_scl   # Fashion-MNIST by the paper's protocol, d = 512,
#                                            # 100 epochs (<= 8 min a step; also q_fashion_vicreg, q_fashion_lightly)
#
# First it installs from .whl/ (WHEELS=...) with `pip install --no-index --no-deps --target` on top of the image's
# torch (never replacing torch, torchvision or numpy) and prints which package came from where; never
# `pip install -e .`. Each step runs under its time box; benchmarks/gpu/REPORT.md and report.json (OUT_DIR=...)
# get the device, versions, every figure and every PASS/FAIL/TIMEOUT, rewritten after each step and merged over
# parts; logs in OUT_DIR/logs. On a GPU it exits 0 even when steps fail (the report says which). Without CUDA
# (or with --dry-run) it lists the GPU steps and runs the CPU dry run instead (exit 1 if that fails).
#
# Python: $PYTHON, else the checkout's .venv when it has eigtrain (this machine), else the first of python3, python,
# python3.12 that imports torch (the device image).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if "$repo/.venv/bin/python" -c "import eigtrain" 2>/dev/null; then PY=$repo/.venv/bin/python; fi
fi
if [ -z "$PY" ]; then  # the image's Python: the first that has torch
  for candidate in python3 python python3.12; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then PY=$candidate; break; fi
  done
  PY=${PY:-python3}
fi
# Fashion-MNIST's idx files, carried as .idx/ (tools/device_wheels.sh puts them there): the device has no apt
if [ -z "${FASHION_MNIST_IDX:-}" ] && [ -d "$repo/.idx/fashion-mnist" ]; then
  export FASHION_MNIST_IDX=$repo/.idx/fashion-mnist
fi
exec "$PY" "$repo/tools/gpu_check.py" "$@"
