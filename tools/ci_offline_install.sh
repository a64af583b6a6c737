#!/usr/bin/env bash
# CI: the GPU machine's offline install, proven here without a GPU (tests/launch/test_gpu_check.py runs it; slow).
#
#   bash tools/ci_offline_install.sh
#
# 1. tools/device_wheels.sh for CPython 3.12 manylinux x86-64 (the device's): pip resolves every wheel, <= 64 MiB.
# 2. The same set for this machine's Python, and a fresh venv that sees ONLY what the device image holds (torch,
#    torchvision, timm, numpy, safetensors, scikit-learn, matplotlib, tqdm, rich, pytest and their own
#    dependencies: a directory of symlinks into the checkout's .venv, put on the path by a .pth file, so torch is
#    not downloaded again). No hydra, omegaconf, webdataset, submitit, deepspeed, kornia, wandb, eigtrain.
# 3. tools/gpu_check.sh --dry-run in that venv with no network index: it installs from the wheels with
#    --no-index --no-deps --target, lists its steps with their time boxes and runs the CPU dry run's steps that
#    train and benchmark in that venv (host syncs, bench_gpu --dry-run). Its resume and rr steps, three trainings
#    and an export in fresh processes, are tests/launch/test_gpu_check.py's, run in-process (STEPS=all: these too).
# 4. eigtrain-train with wandb's default mode in that venv (wandb is absent): it trains and logs to metrics.jsonl.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d)
[ -n "${KEEP_WORK:-}" ] && echo "ci_offline_install: keeping $work" || trap 'rm -rf "$work"' EXIT
t0=$SECONDS
steps=--steps=cpu_host_syncs_plumbing,cpu_bench_dry_run
[ "${STEPS:-}" = all ] && steps=

PYTHON=$py bash "$repo/tools/device_wheels.sh" --python-version 3.12 --out "$work/whl312"
here=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYTHON=$py bash "$repo/tools/device_wheels.sh" --python-version "$here" --out "$work/whl" --pure-from "$work/whl312"

"$py" -m venv "$work/venv"  # with pip (ensurepip's bundled wheel: no network)
"$py" - "$work/image" <<'PY'
# The device image: these distributions and their dependencies, closed over Requires-Dist (extras excluded).
import re, sys
from importlib import metadata
from pathlib import Path

IMAGE = ["torch", "torchvision", "timm", "numpy", "safetensors", "scikit-learn", "matplotlib", "tqdm", "rich", "pytest"]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
dists = {norm(d.metadata["Name"]): d for d in metadata.distributions()}
todo, seen = [norm(n) for n in IMAGE], set()
while todo:
    name = todo.pop()
    if name in seen or name not in dists:
        continue
    seen.add(name)
    for req in dists[name].requires or []:
        if "extra ==" not in req:
            todo.append(norm(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
image = Path(sys.argv[1])
image.mkdir()
for name in sorted(seen):
    d = dists[name]
    top = {Path(f).parts[0] for f in d.files or [] if not str(f).startswith("..")}
    for entry in top:
        src = Path(d.locate_file(entry))
        if src.exists() and not (image / entry).exists() and not entry.endswith(".pth"):
            (image / entry).symlink_to(src)
print(f"ci_offline_install: image of {len(seen)} distributions: {', '.join(sorted(seen))}")
assert not {"hydra-core", "omegaconf", "webdataset", "deepspeed", "kornia", "wandb", "eigtrain"} & seen
PY
"$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' | \
  xargs -I{} sh -c "echo '$work/image' > {}/device_image.pth"

unset PYTHONPATH
export CUDA_VISIBLE_DEVICES="" PIP_NO_INDEX=1 PIP_FIND_LINKS=""  # nothing from an index in what follows
if "$work/venv/bin/python" -c "import hydra" 2>/dev/null; then
  echo "ci_offline_install: the fresh venv sees hydra: not the device image" >&2; exit 1
fi
PYTHON=$work/venv/bin/python WHEELS=$work/whl OUT_DIR=$work/gpu SITE_DIR=$work/site RUNS_DIR=$work/runs \
  bash "$repo/tools/gpu_check.sh" --dry-run $steps | tee "$work/gpu_check.out"
grep -q "CPU dry run OK" "$work/gpu_check.out"
grep -q "from .whl" "$work/gpu_check.out"

mkdir "$work/elsewhere" && cd "$work/elsewhere"
PYTHONPATH=$work/site "$work/venv/bin/python" -m eigtrain.train.command experiment=cpu_debug steps=1 log_every=1 \
  checkpoint_every=1 logging.progress=false "data.root=$work/digits" 2>&1 | tee "$work/train.out"
grep -q "wandb is not installed" "$work/train.out"
test -s runs/cpu_debug/metrics.jsonl
echo "ci_offline_install: OK in $((SECONDS - t0)) s (3.12 wheels resolve; offline install + CPU dry run in an image-only venv)"
