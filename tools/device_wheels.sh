#!/usr/bin/env bash
# Wheels for the offline GPU machine: every package eigtrain needs beyond that machine's image, for its Python.
#
#   bash tools/device_wheels.sh                              # .whl/ for CPython 3.12, manylinux x86-64
#   bash tools/device_wheels.sh --python-version 3.11 --out DIR   # the same set for another Python (CI here)
#
# The GPU machine has no network; its image holds Python 3.12, torch (CUDA), torchvision, timm, numpy, safetensors,
# scikit-learn (scipy), matplotlib, tqdm, rich, pillow and pytest. What travels there is the git tree plus a few
# git-ignored paths of at most 64 MiB in all, so .whl/ (git-ignored) must stay under 64 MiB; this script prints
# the total and fails above it. tools/gpu_check.sh installs from it with `pip install --no-index --no-deps
# --target`, taking from .whl/ only what the image lacks (or holds too old), never torch/torchvision/numpy.
#
# Versions are pinned to this checkout's .venv (the versions CI tests), which this script sets up (tools/venv.sh's
# '.[dev]' install, as tools/lint.sh) when it is missing or lacks a package; PYTHON=... pins to another
# environment. Binary wheels are downloaded for the target Python and platform (--only-binary=:all:); the two
# source-only distributions (deepspeed, without its CUDA ops: DS_BUILD_OPS=0; antlr4-python3-runtime) are built
# here into pure-Python wheels; eigtrain's wheel is
# built from this tree (gpu_check.sh rebuilds it on the device from the tree that travelled, and falls back to
# this one). Left out: wandb (~20 MiB; eigtrain logs to metrics.jsonl without it) and torch and its image.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
if [ -z "${PYTHON:-}" ] && ! "$py" -c "import importlib.util as u, sys
sys.exit(any(u.find_spec(m) is None for m in ('eigtrain', 'deepspeed', 'hydra', 'kornia', 'webdataset')))" 2>/dev/null
then
  # no quickstart venv (or an incomplete one): make it as tools/lint.sh and the quickstart do; its versions are CI's
  echo "device_wheels: $py lacks eigtrain's packages: setting up $repo/.venv (tools/venv.sh, '.[dev]')" >&2
  # a stamp may say installed while a package is missing (removed since): install again
  (cd "$repo" && source tools/venv.sh && rm -f .venv/eigtrain-install.stamp && venv_install '[dev]')
  py=$repo/.venv/bin/python
fi
out=$repo/.whl
pyver=3.12
limit_mib=64
pure_from=
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    --pure-from) pure_from=$2; shift 2 ;;  # take the pure-Python wheels (built ones) from an earlier --out
    *) echo "device_wheels: unknown argument $1 (known: --out DIR, --python-version X.Y, --pure-from DIR)" >&2
       exit 2 ;;
  esac
done

# Binary wheels (with their own dependencies beyond the image, listed explicitly: --no-deps).
BINARY=(hydra-core omegaconf webdataset braceexpand submitit cloudpickle kornia kornia_rs
        einops hjson msgpack ninja psutil py-cpuinfo pydantic pydantic_core annotated-types typing-inspection
        typing_extensions PyYAML packaging setuptools)
SOURCE=(deepspeed antlr4-python3-runtime)  # sdists only: built here, pure Python
# lightly and what it imports beyond the image (the Fashion-MNIST report's peers, gpu_check --part 4), taken when
# this environment has them (pip install -e '.[peers]'): the versions the CPU report ran
PEERS=(lightly pytorch_lightning lightning_utilities torchmetrics fsspec)

pinned() {  # NAME...: NAME==VERSION as installed in $py's environment
  "$py" - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
try:
    print("\n".join(f"{name}=={version(name)}" for name in sys.argv[1:]))
except PackageNotFoundError as missing:
    sys.exit(f"device_wheels: {missing.name} is not installed in {sys.executable}: install eigtrain[dev] first")
PY
}

abi=cp${pyver/./}
mkdir -p "$out"
if [ -n "$(ls -A "$out")" ] && [ ! -e "$out/.device-wheels" ]; then  # never delete wheels this script did not write
  echo "device_wheels: $out is not empty and was not written by this script: choose another --out" >&2
  exit 1
fi
rm -f "$out"/*.whl
touch "$out/.device-wheels"
echo "device_wheels: ${#BINARY[@]} binary wheels for CPython $pyver manylinux x86-64 -> $out"
mapfile -t binary < <(pinned "${BINARY[@]}")
if "$py" -c "import lightly" 2>/dev/null; then
  mapfile -t -O "${#binary[@]}" binary < <(pinned "${PEERS[@]}")
else
  echo "device_wheels: lightly is not installed in $py: no peers' wheels (gpu_check's q_fashion_lightly needs them)" >&2
fi
"$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$out" \
  --python-version "$pyver" --implementation cp --abi "$abi" --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  "${binary[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

echo "device_wheels: building ${SOURCE[*]} (pure Python; DeepSpeed without ops) and eigtrain"
mapfile -t source < <(pinned "${SOURCE[@]}")
if [ -n "$pure_from" ]; then  # py3-none-any wheels serve every Python: no second build (CI builds for two)
  cp "$pure_from"/deepspeed-*.whl "$pure_from"/antlr4_python3_runtime-*.whl "$pure_from"/eigtrain-*.whl "$out"/
else
  DS_BUILD_OPS=0 "$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" \
    "${source[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  bash "$repo/tools/ci_wheel.sh" --build "$out"
fi

# Fashion-MNIST's four idx files (Debian's dataset-fashion-mnist, 30 MB) travel beside the wheels, as .idx/: the
# device has no apt; tools/gpu_check.sh points FASHION_MNIST_IDX at them (carry .whl and .idx)
idx=${FASHION_MNIST_IDX:-/usr/share/datasets/fashion-mnist}
idx_bytes=0
if [ "$out" = "$repo/.whl" ] && [ -d "$idx" ]; then
  mkdir -p "$repo/.idx/fashion-mnist"
  cp "$idx"/*-ubyte* "$repo/.idx/fashion-mnist/"
  idx_bytes=$(cat "$repo/.idx/fashion-mnist"/* | wc -c)
fi
count=$(ls "$out"/*.whl | wc -l)
bytes=$(cat "$out"/*.whl | wc -c)
echo "device_wheels: $count wheels, $((bytes / 1024)) KiB, and $((idx_bytes / 1024)) KiB of idx files in all (limit $limit_mib MiB)"
if [ $((bytes + idx_bytes)) -gt $((limit_mib * 1024 * 1024)) ]; then
  echo "device_wheels: $out and .idx are over $limit_mib MiB: they cannot travel to the GPU machine" >&2
  exit 1
fi
