#!/usr/bin/env bash
# CI: the eigtrain wheel, installed into a fresh virtual environment, trains from an unrelated directory.
#
#   tools/ci_wheel.sh                 build, install into a fresh venv, train (cpu_debug, 3 steps) elsewhere
#   tools/ci_wheel.sh --keep DIR      the same, and leave the wheel in DIR (tests/system/test_packaging.py runs
#                                     this, so the test suite of .ci/run builds the wheel once and checks it all)
#   tools/ci_wheel.sh --build DIR     only build the wheel into DIR (tools/device_wheels.sh)
#
# The wheel is built from a copy of the sources (pyproject.toml, setup.py, eigtrain/, configs/, launch/), as a
# release would be. The fresh venv gets eigtrain from that wheel only (pip install --no-deps); its
# dependencies (torch, hydra, ...: several GB) come from the checkout's .venv through a .pth file instead of
# a second download. The checks: `import eigtrain` resolves to the fresh venv's site-packages, there is no
# top-level `launch` (or `configs`) module, and `eigtrain-train` finds its configs inside the package.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() {  # build the wheel into $1
  mkdir -p "$work/src" "$1"
  (cd "$repo" && tar --exclude=__pycache__ -cf - pyproject.toml setup.py README.md eigtrain configs launch) | tar -xf - -C "$work/src"
  "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$1" "$work/src"
}

if [ "${1:-}" = "--build" ]; then
  build "$2"
  exit 0
fi

build "$work/dist"
if [ "${1:-}" = "--keep" ]; then
  mkdir -p "$2"
  cp "$work"/dist/eigtrain-*.whl "$2"/
fi
"$py" -m venv --without-pip "$work/venv"
fresh=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > "$fresh/eigtrain_ci_dependencies.pth"
"$py" -m pip --python "$work/venv/bin/python" install -q --no-deps "$work"/dist/eigtrain-*.whl

mkdir "$work/elsewhere"
cd "$work/elsewhere"
unset PYTHONPATH
"$work/venv/bin/python" - "$fresh" <<'PY'
import importlib.resources, importlib.util, sys
from pathlib import Path

import eigtrain

fresh = Path(sys.argv[1]).resolve()
assert Path(eigtrain.__file__).resolve().is_relative_to(fresh), f"eigtrain imported from {eigtrain.__file__}, not {fresh}"
for name in ("launch", "configs"):
    assert importlib.util.find_spec(name) is None, f"the wheel installs a top-level module {name!r}"
import eigtrain.launch.slurm  # noqa: F401
assert (importlib.resources.files("eigtrain.configs") / "experiment" / "cpu_debug.yaml").is_file()
print(f"ci_wheel: eigtrain from {Path(eigtrain.__file__).parent}; no top-level launch/configs")
PY
"$work/venv/bin/eigtrain-train" experiment=cpu_debug steps=3 checkpoint_every=3 log_every=1 \
    logging.wandb.mode=disabled logging.progress=false
test -s runs/cpu_debug/model.safetensors
"$work/venv/bin/python" -c 'import json; lines = open("runs/cpu_debug/metrics.jsonl").read().splitlines(); assert json.loads(lines[-1])["step"] == 3, lines'
echo "ci_wheel: the wheel trained from $PWD (runs/cpu_debug: 3 steps, model.safetensors)"
