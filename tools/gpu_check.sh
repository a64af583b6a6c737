#!/usr/bin/env bash
# One command for the GPU code paths, end to end, then the GPU benchmark (tools/bench_gpu.py):
#
#   bash tools/gpu_check.sh            # on a CUDA machine: every check below + benchmark; exit 1 if a check fails
#   OUT_DIR=/tmp/gpu bash tools/gpu_check.sh   # keep the logs, runs and bench_gpu.json there
#
# Checks (CUDA): bf16 autocast + channels_last + torch.compile; GPU augmentation + nvJPEG decoding of JPEG
# shards; NCCL DDP with SyncBatchNorm and exact gradient accumulation (2 ranks when there are 2 GPUs);
# DeepSpeed ZeRO-2 and ZeRO-3; stop + resume; host synchronisations per step (torch's CUDA sync debug mode);
# eigtrain-rr (Rayleigh-Ritz export) and eigtrain-eval on the trained run.
# Without CUDA it says so and does a CPU dry run of the same plumbing (train with accumulation, stop + resume
# bit for bit, eigtrain-rr, bench_gpu.py --dry-run) and exits 0.
#
# Python: $PYTHON, else the repository's .venv; a bare machine gets a .venv with `pip install -e .`
# (--system-site-packages, so a preinstalled torch is used as is).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if ! .venv/bin/python -c "import eigtrain" 2>/dev/null; then
    echo "gpu_check: setting up .venv (pip install -e .)"
    python3 -m venv --system-site-packages .venv && .venv/bin/python -m pip install -q -e . || {
      echo "gpu_check: could not install eigtrain into .venv"; exit 1; }
  fi
  PY=.venv/bin/python
fi
OUT=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
COMMON=(logging.wandb.mode=disabled logging.progress=false "data.root=$OUT/digits" log_every=1)
declare -a RESULTS=()
failed=0

check() {  # check NAME command...: run, log to $OUT/NAME.log, record PASS/FAIL with the time taken
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$OUT/$name.log" 2>&1; then
    RESULTS+=("PASS $name ($((SECONDS - t0)) s)")
  else
    RESULTS+=("FAIL $name ($((SECONDS - t0)) s): see $OUT/$name.log")
    failed=1
    tail -n 15 "$OUT/$name.log" | sed "s/^/  [$name] /"
  fi
  echo "${RESULTS[-1]}"
}

train() { "$PY" -m eigtrain.train experiment=cpu_debug "${COMMON[@]}" "$@"; }

same_losses() {  # same_losses RUN_A RUN_B RTOL: the logged losses agree (within RTOL; 0 = bit for bit)
  "$PY" - "$@" <<'PY'
import math, sys
from eigtrain.metrics_log import read_metrics
a, b, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3])
la, lb = ([(m["step"], m["loss"]) for m in read_metrics(r)] for r in (a, b))
assert [s for s, _ in la] == [s for s, _ in lb], (la, lb)
bad = [(s, x, y) for (s, x), (_, y) in zip(la, lb) if not (x == y if rtol == 0 else math.isclose(x, y, rel_tol=rtol))]
assert not bad, f"losses differ: {bad}"
print(f"{len(la)} logged losses agree (rtol={rtol})")
PY
}

resume_check() {  # resume_check DEVICE RTOL: stop after 2 steps, resume to 4; compare with an uninterrupted run
  local device=$1 rtol=$2  # micro_batch_size=32: 2 accumulation steps (the exact accumulated backward)
  local args=(device="$device" steps=4 checkpoint_every=2 micro_batch_size=32)
  train "${args[@]}" "run_dir=$OUT/resume_ref" &&
    train "${args[@]}" stop_after=2 "run_dir=$OUT/resume" &&
    train "${args[@]}" "run_dir=$OUT/resume" &&
    same_losses "$OUT/resume_ref" "$OUT/resume" "$rtol"
}

if [ "$NGPU" = "0" ]; then
  echo "gpu_check: no CUDA device visible: the GPU checks and the GPU benchmark need one (nothing measured)."
  echo "gpu_check: CPU dry run of the same plumbing (logs in $OUT)"
  check cpu_stop_resume resume_check cpu 0
  check cpu_rr "$PY" -m eigtrain.rr_job "run_dir=$OUT/resume" device=cpu num_workers=0 "out=$OUT/resume/rr"
  check cpu_bench_dry_run "$PY" tools/bench_gpu.py --dry-run
  printf '%s\n' "${RESULTS[@]}" >"$OUT/summary.txt"
  if [ "$failed" = 0 ]; then echo "gpu_check: CPU dry run OK (no GPU: nothing measured)"; exit 0; fi
  echo "gpu_check: CPU dry run FAILED"; exit 1
fi

echo "gpu_check: $NGPU CUDA device(s): $("$PY" -c "import torch; print(torch.cuda.get_device_name(0))"); logs in $OUT"
RANKS=$([ "$NGPU" -ge 2 ] && echo 2 || echo 1)
torchrun() { "$PY" -m torch.distributed.run --standalone --nproc_per_node "$RANKS" -m eigtrain.train experiment=cpu_debug "${COMMON[@]}" "$@"; }
RESNET=(model=resnet18 model.cifar_stem=true model.projector_hidden=512)

check bf16_channels_last_compile train device=cuda "${RESNET[@]}" engine.precision=bf16 engine.channels_last=true \
  engine.compile=true steps=6 "run_dir=$OUT/bf16"
jpeg_check() {  # random JPEG shards (bench_gpu.write_jpeg_shards), decoded by nvJPEG, augmented on the GPU
  "$PY" - "$OUT/jpeg" <<'PY' &&
import sys
from pathlib import Path
sys.path.insert(0, "tools")
from bench_gpu import write_jpeg_shards
write_jpeg_shards(Path(sys.argv[1]), 32, 512)
PY
  "$PY" -m eigtrain.train experiment=cpu_debug logging.wandb.mode=disabled logging.progress=false log_every=1 \
    device=cuda "${RESNET[@]}" "data.root=$OUT/jpeg/shards" data.write_if_missing=null data.decode=cuda \
    data.augment=cifar "data.image_size=[32,32]" "data.mean=[0.5,0.5,0.5]" "data.std=[0.25,0.25,0.25]" steps=6 \
    "run_dir=$OUT/jpeg_run"
}
check jpeg_gpu_decode_augment jpeg_check
# nccl; SyncBatchNorm (ResNet default) needs 2 GPUs; micro_batch_size makes 2 accumulation steps (exact path).
check "nccl_ddp_syncbn_accumulation_${RANKS}rank" torchrun device=cuda "${RESNET[@]}" "micro_batch_size=$((64 / RANKS / 2))" \
  steps=6 "run_dir=$OUT/ddp"
check deepspeed_zero2 torchrun device=cuda engine=deepspeed engine.zero_stage=2 steps=6 "run_dir=$OUT/zero2"
check deepspeed_zero3 torchrun device=cuda engine=deepspeed engine.zero_stage=3 steps=6 "run_dir=$OUT/zero3"
check stop_resume resume_check cuda 1e-3   # GPU kernels are not bit-reproducible run to run; close is the check
check host_syncs_per_step "$PY" - "$OUT" <<'PY'
# torch's CUDA sync debug mode warns at every synchronising call; count them per step (steps 2..20 neither log
# nor save; step 1 warms up, step 21 logs and saves).
import sys, warnings
import torch
from eigtrain.metrics_log import Throughput
from eigtrain.train import compose_config, run
out, steps = sys.argv[1], 21
cfg = compose_config(["experiment=cpu_debug", "device=cuda", f"data.root={out}/digits", f"run_dir={out}/syncs",
                      "logging.wandb.mode=disabled", "logging.progress=false", f"steps={steps}", f"log_every={steps}",
                      f"checkpoint_every={steps}"])
marks = []
add = Throughput.add
Throughput.add = lambda self, *a: (marks.append(len(caught)), add(self, *a))[1]
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    run(cfg)
torch.cuda.set_sync_debug_mode("default")
marks.append(len(caught))
per_step = [b - a for a, b in zip(marks, marks[1:])]  # per_step[i]: step i + 1
print("synchronising calls per step:", per_step)
for w in caught[marks[1]:marks[-2]][:10]:
    print("  ", w.filename, w.lineno, str(w.message)[:120])
assert max(per_step[1:steps - 1]) <= 1, "more than one host synchronisation in a step that neither logs nor saves"
PY
check rr_job "$PY" -m eigtrain.rr_job "run_dir=$OUT/bf16" device=cuda "out=$OUT/bf16/rr"
check eval_export "$PY" -m eigtrain.evaluate "run_dir=$OUT/bf16" device=cuda "out=$OUT/bf16/eval"
check bench_gpu bash -c "\"$PY\" tools/bench_gpu.py > \"$OUT/bench_gpu.json\""
[ -s "$OUT/bench_gpu.json" ] && cat "$OUT/bench_gpu.json"

printf '%s\n' "${RESULTS[@]}" | tee "$OUT/summary.txt"
if [ "$failed" = 0 ]; then echo "gpu_check: all GPU checks passed"; exit 0; fi
echo "gpu_check: some GPU checks FAILED"; exit 1
