"""Benchmark the data path; prints one JSON object.

    python tools/bench_data.py                       # CIFAR-like 32x32, cifar preset, 2 workers, 2 cores
    python tools/bench_data.py --size 96 --preset imagenet --images 2048

Measured side by side in one run, on the same cores (the process and its workers are pinned to --cores CPUs):
- stream: ShardStream (decode in --workers workers) + batched augmentation of both views in the main process
  (torch threads = --threads);
- torchvision: the usual per-image pipeline, webdataset + DataLoader with the same --workers, decode and
  torchvision.transforms.v2 with the same augmentations for both views in the workers;
- augment only: both augmentations on one decoded batch, in this process, one thread;
- decode: images/s of one worker (num_workers=0, in this process), no augmentation.
Repeats alternate between the pipelines; the medians are reported.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from eigtrain.data import ShardStream, build_augment, write_shards
from eigtrain.data.augment import NORMALIZATION, PRESETS
from eigtrain.data.decode import decode_image_bytes
from eigtrain.schema import DataConfig

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)


def synthetic_images(n: int, size: int, seed: int = 0):
    """Smooth random RGB images (upsampled noise): PNG sizes close to natural images, unlike white noise."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        coarse = rng.integers(0, 256, (max(size // 4, 2), max(size // 4, 2), 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((size, size), Image.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        yield {"__key__": f"img-{i:07d}", "png": buffer.getvalue(), "cls": i % 10}


def torchvision_views(preset: str, size: int, pil_input: bool = False, interpolation=v2.InterpolationMode.BILINEAR):
    """The preset's two views as per-image torchvision.transforms.v2 pipelines on uint8 tensors (or PIL images,
    `pil_input`, as open_clip's webdataset pipelines feed them)."""
    mean, std = NORMALIZATION[preset]
    composes = []
    for r in PRESETS[preset]:
        steps = []
        if r.crop_scale is not None:
            steps.append(
                v2.RandomResizedCrop(
                    size, scale=r.crop_scale, ratio=r.crop_ratio, interpolation=interpolation, antialias=True
                )
            )
        if r.flip_p:
            steps.append(v2.RandomHorizontalFlip(r.flip_p))
        if r.jitter is not None:
            steps.append(v2.RandomApply([v2.ColorJitter(*r.jitter)], p=r.jitter_p))
        if r.gray_p:
            steps.append(v2.RandomGrayscale(r.gray_p))
        if r.blur_p:
            radius = min(int(np.ceil(3 * r.blur_sigma[1])), size - 1)
            steps.append(v2.RandomApply([v2.GaussianBlur(2 * radius + 1, r.blur_sigma)], p=r.blur_p))
        if r.solarize_p:
            steps.append(v2.RandomSolarize(128, p=r.solarize_p))
        steps += [
            *([v2.ToImage()] if pil_input else []),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
        composes.append(v2.Compose(steps))
    return composes


class PerImageViews:
    def __init__(self, preset, size):
        self.views = torchvision_views(preset, size)

    def __call__(self, sample):
        image = decode_image_bytes(sample["png"], 3, None)
        return self.views[0](image), self.views[1](image), int(sample["cls"])


def run_stream(root, args, augment) -> float:
    stream = ShardStream(DataConfig(root=str(root), num_workers=args.workers), batch_size=args.batch, seed=0)
    generator = torch.Generator().manual_seed(0)
    it = iter(stream)
    augment(next(it)["image"], generator)  # worker start-up and first batch are not timed
    start, images = time.perf_counter(), 0
    for _ in range(stream.batches_per_epoch - 1):
        batch = next(it)
        augment(batch["image"], generator)
        images += len(batch["key"])
    return images / (time.perf_counter() - start)


def run_torchvision(root, args) -> float:
    urls = [str(p) for p in sorted(Path(root).glob("train-*.tar"))]
    dataset = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.map(PerImageViews(args.preset, args.size)),
        wds.batched(args.batch),
    )
    it = iter(DataLoader(dataset, batch_size=None, num_workers=args.workers))
    next(it)
    start, images = time.perf_counter(), 0
    for view1, _, _ in it:
        images += len(view1)
    return images / (time.perf_counter() - start)


def augment_only(batch, augment, preset, size) -> tuple[float, float]:
    generator = torch.Generator().manual_seed(0)
    augment(batch, generator)
    start = time.perf_counter()
    augment(batch, generator)
    batched = len(batch) / (time.perf_counter() - start)
    views = torchvision_views(preset, size)
    start = time.perf_counter()
    for image in batch:
        views[0](image), views[1](image)
    return batched, len(batch) / (time.perf_counter() - start)


def decode_rate(root, args) -> float:
    stream = ShardStream(DataConfig(root=str(root), num_workers=0), batch_size=args.batch, seed=0)
    it = iter(stream)
    next(it)
    start, images = time.perf_counter(), 0
    for _ in range(stream.batches_per_epoch - 1):
        images += len(next(it)["key"])
    return images / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4096)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--preset", default="cifar", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="pin this process and its workers to this many CPUs")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of the main process (default: the cores the workers leave, at least 1; "
        "more oversubscribes the cores and OpenMP threads then stall each other)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    os.sched_setaffinity(0, cores)  # DataLoader workers inherit it: both pipelines get the same CPUs
    args.threads = args.threads or max(1, len(cores) - args.workers)
    torch.set_num_threads(args.threads)
    augment = build_augment(args.preset, image_size=args.size)

    with tempfile.TemporaryDirectory() as tmp:
        write_shards(
            tmp,
            {"train": synthetic_images(args.images, args.size)},
            shard_size=args.images // 8,
            meta=dict(mode="views", channels=3, image_shape=[3, args.size, args.size], labels=True),
        )
        stream, baseline = [], []
        for _ in range(args.repeats):
            stream.append(run_stream(tmp, args, augment))
            baseline.append(run_torchvision(tmp, args))
        batch = next(iter(ShardStream(DataConfig(root=str(tmp), num_workers=0), batch_size=args.batch, seed=0)))[
            "image"
        ]
        torch.set_num_threads(1)
        batched_1t, per_image_1t = augment_only(batch, augment, args.preset, args.size)
        decode = [decode_rate(tmp, args) for _ in range(args.repeats)]

    stream_rate, baseline_rate = statistics.median(stream), statistics.median(baseline)
    print(
        json.dumps(
            {
                "config": {**vars(args), "cores": cores, "load_average_1min": os.getloadavg()[0]},
                "pipeline_images_per_s": {
                    "stream_batched_augment": round(stream_rate, 1),
                    "torchvision_v2_per_image": round(baseline_rate, 1),
                    "speedup": round(stream_rate / baseline_rate, 2),
                    "runs": {"stream": [round(x, 1) for x in stream], "torchvision": [round(x, 1) for x in baseline]},
                },
                "augment_only_one_thread_images_per_s": {
                    "batched": round(batched_1t, 1),
                    "per_image_v2": round(per_image_1t, 1),
                    "speedup": round(batched_1t / per_image_1t, 2),
                },
                "decode_images_per_s_per_worker": round(statistics.median(decode), 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
