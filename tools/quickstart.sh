#!/usr/bin/env bash
# The main job, from a fresh clone: set up, write digits shards, pretrain (SCL, joint nesting, tiny CNN;
# the GPU if there is one), Rayleigh-Ritz export, adaptive-dimension evaluation.
#   bash tools/quickstart.sh                 # ~6 minutes on 2 CPU cores, install included (what CI runs)
#   STEPS=40 bash tools/quickstart.sh        # a shorter run
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR=${RUN_DIR:-runs/quickstart}
STEPS=${STEPS:-300}

source tools/venv.sh
venv_install

.venv/bin/eigtrain-train experiment=quickstart run_dir="$RUN_DIR" steps="$STEPS" logging.wandb.mode=disabled
.venv/bin/eigtrain-rr run_dir="$RUN_DIR"
.venv/bin/eigtrain-eval run_dir="$RUN_DIR"
echo
echo "Export:  $RUN_DIR/rr/rr.safetensors (+ manifest.json, eigenvalues.png)"
echo "Tables:  $RUN_DIR/eval/table.md, $RUN_DIR/eval/table.csv; plot: $RUN_DIR/eval/accuracy_vs_dim.png"
