"""GPU training throughput and MFU of the trainer's step, real shards against synthetic in-memory input; prints JSON.

For each (model, image size) it times the trainer's own step (uint8 batch -> device -> augmentation -> encoder
under bf16 autocast on both views -> objective in fp32 -> backward -> guarded optimizer update), fed
  - synthetic: one uint8 batch that already lives on the GPU (no loader, no copy): the compute-bound rate;
  - shards: the training loader (ShardStream, pinned memory, non_blocking copies) over real shards;
side by side in one process, and reports images/s of each, the data-bound share 1 - shards / synthetic, and the
model FLOPs utilization (MFU: 3 x forward FLOPs of both views per image, counted by torch's FlopCounterMode,
over the GPU's dense bf16 peak).

    python tools/bench_gpu.py                                   # resnet18@32 and resnet50@224, JPEG shards made here
    python tools/bench_gpu.py --cases resnet50:224 --root data/imagenette --steps 50
    python tools/bench_gpu.py --dry-run                         # CPU: tiny CNN on digits, a few steps (plumbing only)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from eigtrain.data import build_augment
from eigtrain.data import from_config as data_setup
from eigtrain.engine import build_engine, chunks
from eigtrain.engine.base import enable_cuda_fast_paths
from eigtrain.models import build_encoder
from eigtrain.objectives import build_objective
from eigtrain.train import compose_config, make_loss_fn

# Dense bf16 tensor-core peaks (TFLOP/s) by device name; --peak-tflops overrides.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756.0
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def write_jpeg_shards(root: Path, size: int, n: int) -> Path:
    """A labelled image folder of random JPEGs (smooth noise, so they compress like photos), as eigtrain shards."""
    from PIL import Image

    from eigtrain.data.write import main as write_shards_cli

    rng = np.random.default_rng(0)
    folder = root / "folder"
    for split, count in (("train", n), ("val", max(8, n // 8))):
        for i in range(count):
            low = rng.integers(0, 256, (size // 8 + 1, size // 8 + 1, 3), dtype=np.uint8)
            image = Image.fromarray(low).resize((size, size), Image.BILINEAR)
            path = folder / split / f"c{i % 10}" / f"{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, quality=90)
    write_shards_cli(["source=imagefolder", f"path={folder}", f"out={root / 'shards'}", "shard_size=256"])
    return root / "shards"


def trainer_pieces(model: str, size: int, batch: int, root: Path, device: torch.device, compile: bool, workers: int):
    augment = "digits" if model == "tiny_cnn" else ("cifar" if size <= 64 else "imagenet")
    overrides = [f"model={model}", f"batch_size={batch}", "objective=scl", f"data.root={root}", f"data.augment={augment}",
                 "data.write_if_missing=null", f"engine.compile={str(compile).lower()}", f"data.num_workers={workers}"]
    if model != "tiny_cnn":
        overrides += [f"data.image_size=[{size},{size}]", "data.mean=[0.5,0.5,0.5]", "data.std=[0.25,0.25,0.25]"]
    if model.startswith("resnet") and size <= 64:
        overrides.append("model.cifar_stem=true")
    cfg = compose_config(overrides)
    channels = 1 if model == "tiny_cnn" else 3
    torch.manual_seed(0)
    encoder = build_encoder(cfg.model, cfg.dim, (channels, size, size))
    engine = build_engine(cfg.engine, cfg.optim, encoder, device=device, micro_batch_size=batch, grad_accum_steps=1)
    objective = build_objective("scl", cfg.dim).to(device)
    views = build_augment(cfg.data.augment, mean=tuple(cfg.data.mean or ()) or None,
                          std=tuple(cfg.data.std or ()) or None).to(device)
    return cfg, engine, make_loss_fn(engine, objective, pairs=False), views, channels


def forward_flops(engine, channels: int, size: int, batch: int, device: torch.device) -> float:
    """FLOPs of one forward pass of the encoder over 2 x batch views (torch's counter: 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(2 * batch, channels, size, size, device=device)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad(), engine.autocast():
        engine.model(x)
    return float(counter.get_total_flops())


def timed_steps(engine, loss_fn, views, batches, steps: int, warmup: int, device: torch.device) -> float:
    """Seconds per step of the trainer's step fed by `batches` (an iterator of uint8 image batches)."""
    generator = torch.Generator(device=device).manual_seed(0)

    def step():
        images = next(batches).to(device, non_blocking=True)
        first, second = views(images, generator=generator)
        engine.train_step(list(zip(chunks(first, 1), chunks(second, 1))), loss_fn, lr=0.01)

    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def bench_case(model: str, size: int, batch: int, root: Path, device: torch.device, steps: int, warmup: int,
               compile: bool, peak: float | None, workers: int) -> dict:
    cfg, engine, loss_fn, views, channels = trainer_pieces(model, size, batch, root, device, compile, workers)
    stream = data_setup.build_stream(cfg.data, batch_size=batch, rank=0, world_size=1, seed=0, device=device)
    loader = (b["image"] for b in stream)
    first = next(loader)
    resident = first.to(device)  # synthetic: the same batch, already on the device
    synthetic_s = timed_steps(engine, loss_fn, views, iter(lambda: resident, None), steps, warmup, device)
    shards_s = timed_steps(engine, loss_fn, views, loader, steps, warmup, device)
    flops_per_step = 3.0 * forward_flops(engine, channels, size, batch, device)  # forward + backward (2x)
    result = {
        "model": model, "image_size": size, "batch": batch, "steps": steps, "compile": compile,
        "synthetic_images_per_s": batch / synthetic_s, "shards_images_per_s": batch / shards_s,
        "data_bound_share": max(0.0, 1.0 - synthetic_s / shards_s),
        "train_tflops_per_step": flops_per_step / 1e12,
    }
    if peak:
        result["mfu_synthetic"] = flops_per_step / synthetic_s / (peak * 1e12)
        result["mfu_shards"] = flops_per_step / shards_s / (peak * 1e12)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="resnet18:32,resnet50:224", help="model:image_size, comma separated")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--root", default=None, help="eigtrain shards to read (default: random JPEG shards made here)")
    parser.add_argument("--images", type=int, default=2048, help="train images of the generated shards")
    parser.add_argument("--compile", action="store_true", help="engine.compile=true")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="loader workers")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny CNN on digits, 2 steps: checks the plumbing")
    args = parser.parse_args()

    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.dry_run else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        enable_cuda_fast_paths()
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "peak_bf16_tflops": peak_tflops(device, args.peak_tflops), "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        if args.dry_run:
            from eigtrain.data.write import main as write_shards_cli

            root = Path(tmp) / "digits"
            write_shards_cli(["source=digits", f"out={root}", "shard_size=200"])
            cases, batch, steps, warmup = [("tiny_cnn", 8)], 32, 2, 1
        else:
            cases = [(m, int(s)) for m, s in (c.split(":") for c in args.cases.split(","))]
            batch, steps, warmup = args.batch, args.steps, args.warmup
        for model, size in cases:
            root = Path(args.root) if args.root else root if args.dry_run else write_jpeg_shards(Path(tmp) / f"jpeg{size}", size, args.images)
            report["results"].append(bench_case(model, size, batch, root, device, steps, warmup, args.compile,
                                                report["peak_bf16_tflops"], 1 if args.dry_run else args.workers))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
