#!/usr/bin/env bash
# Issue 50: the Fashion-MNIST CPU recipe's whole path, timed from a fresh clone on this machine's cores: the
# install (timed apart), the shards from Debian's idx files, eigtrain-train experiment=fashion_mnist_cpu, eigtrain-rr
# and eigtrain-eval with their defaults, as docs/recipes.md writes them. Prints one JSON line (seconds per stage, the
# load average before and after, the probe at full dimension); --out FILE appends it to the JSON list in FILE.
#   bash tools/time_fashion_mnist_cpu.sh [--out benchmarks/fashion_mnist_cpu_path.json]
set -euo pipefail
out=""
[ "${1:-}" = "--out" ] && out=$(realpath -m "$2")
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/eigtrain"
cd "$work/eigtrain"
now() { date +%s.%N; }
load() { cut -d' ' -f1 /proc/loadavg; }
load_before=$(load)
t0=$(now)
(source tools/venv.sh && venv_install '') >/dev/null 2>&1
t1=$(now)
.venv/bin/python tools/fashion_mnist_data.py >/dev/null
t2=$(now)
.venv/bin/eigtrain-train experiment=fashion_mnist_cpu logging.progress=false >/dev/null 2>&1
t3=$(now)
.venv/bin/eigtrain-rr run_dir=runs/fashion_mnist_cpu >/dev/null 2>&1
t4=$(now)
.venv/bin/eigtrain-eval run_dir=runs/fashion_mnist_cpu >/dev/null 2>&1
t5=$(now)
row=$(.venv/bin/python - "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$load_before" "$(load)" "$(git -C "$repo" rev-parse --short HEAD)" <<'EOF'
import json, sys
t = [float(x) for x in sys.argv[1:7]]
report = json.load(open("runs/fashion_mnist_cpu/eval/report.json"))
acc = report["accuracy"]["RR"]
full = max(acc, key=int)
print(json.dumps({
    "commit": sys.argv[9],
    "command": "bash tools/time_fashion_mnist_cpu.sh",
    "seconds": {"install": round(t[1] - t[0], 1), "shards": round(t[2] - t[1], 1), "train": round(t[3] - t[2], 1),
                "rr": round(t[4] - t[3], 1), "eval": round(t[5] - t[4], 1), "path_without_install": round(t[5] - t[1], 1)},
    "load_before": float(sys.argv[7]), "load_after": float(sys.argv[8]),
    "rr_probe_full_dimension": acc[full], "knn": report["knn"].get("rr"),
}))
EOF
)
echo "$row"
if [ -n "$out" ]; then
  python3 - "$out" "$row" <<'EOF'
import json, os, sys
path, row = sys.argv[1], json.loads(sys.argv[2])
old = json.load(open(path)) if os.path.exists(path) else []
json.dump([*old, row], open(path, "w"), indent=1)
open(path, "a").write("\n")
EOF
fi
