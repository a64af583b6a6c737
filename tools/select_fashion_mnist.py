"""Issue 50: score a Fashion-MNIST recipe candidate on the validation carve-out (never the test images).

    python tools/fashion_mnist_data.py                                   # the shards (once)
    python tools/select_fashion_mnist.py NAME [OVERRIDE ...]             # e.g. pool3 model.pool=3
    # -> one JSON line, also appended to benchmarks/fashion_mnist_candidates.jsonl

Trains `experiment=fashion_mnist_cpu` with the overrides on the first 50,000 training images (seed 0), then scores
the last 10,000 with eigtrain-eval's SGD probe: on the projector's l2-normalized output (the space the Rayleigh-Ritz
export spans; the probe whitens its input, so the export's basis does not matter at full dimension) and on the
backbone's features. Minutes per candidate, against the quarter of an hour of the full report."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fashion_mnist_data as fmd  # noqa: E402

from eigtrain.evaluate.probes import probe_accuracy  # noqa: E402
from eigtrain.runs.checkpoint import load_encoder  # noqa: E402
from eigtrain.train.command import compose_config, run  # noqa: E402

RECORD = Path("benchmarks/fashion_mnist_candidates.jsonl")


@torch.no_grad()
def features(model, images: np.ndarray, mean: float, std: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(backbone features, l2-normalized projector output) of 28 x 28 images, normalized as in training."""
    x = (torch.from_numpy(images.astype(np.float32) / 255).unsqueeze(1) - mean) / std
    h = torch.cat([model.backbone(b) for b in x.split(1000)])
    return h, torch.nn.functional.normalize(model.projector(h), dim=1)


def main(name: str, *overrides: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(
            ["experiment=fashion_mnist_cpu", f"data.root={fmd.OUT['select']}", f"run_dir={tmp}/run", "seed=0"]
            + ["logging.progress=false", "logging.wandb.mode=disabled", *overrides]
        )
        start = time.perf_counter()
        run(cfg)
        seconds = time.perf_counter() - start
        model = load_encoder(Path(tmp) / "run")
    (mean,), (std,) = cfg.data.mean, cfg.data.std
    parts = fmd.splits("select", fmd.load())
    (th, tz), (vh, vz) = (features(model, parts[s][0], mean, std) for s in ("train", "val"))
    ty, vy = (torch.from_numpy(parts[s][1].astype(np.int64)) for s in ("train", "val"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    row = {
        "name": name,
        "overrides": list(overrides),
        "commit": commit,
        "steps": cfg.steps,
        "train_s": round(seconds, 1),
        "export_probe": probe_accuracy(tz, ty, vz, vy).item(),
        "backbone_probe": probe_accuracy(th, ty, vh, vy).item(),
        "backbone_dim": th.shape[1],
    }
    with RECORD.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)
    print(json.dumps(main(*sys.argv[1:])))
