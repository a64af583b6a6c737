"""Loader + augmentation throughput on JPEG webdataset shards, per CPU core; prints one JSON object.

    python tools/bench_loader.py                      # 96 px and 224 px, imagenet (VICReg) preset, 2 cores
    python tools/bench_loader.py --sizes 224 --batches 16 --cores 4

Measured side by side in one run on shards written by webdataset's ShardWriter (jpg + cls, smooth synthetic
images, JPEG quality 90) and read by a brace pattern, against open_clip's pipeline
(``wds.WebDataset(urls).shuffle(1000).decode("pilrgb").to_tuple("jpg", "cls").map_tuple(transform).batched(B)``,
the transform being the same preset's two views as per-image torchvision.transforms.v2 on the PIL image, then
ToImage/ToDtype/Normalize):
- all on one core (the goal's figure): both pipelines in this process (no DataLoader workers, one torch
  thread) pinned to one CPU, decoding and making both views: ours is ShardStream(shards=...) + BatchAugment's
  CPU path; the throughput per core of a run without a GPU (whose ranks or workers each do this);
- loader on `cores` cores: ShardStream decoding in `cores` DataLoader workers vs the reference with `cores`
  workers making both views: the CPU work per image of a GPU run, whose augmentation runs batched on the GPU
  (its GPU time is not measured here: no GPU).
Repeats alternate between the pipelines; medians are reported, with the ratio ours / webdataset.
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

import numpy as np
import torch
import webdataset as wds
from bench_data import torchvision_views  # the same per-image reference pipeline (tools/ is on sys.path)
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from eigtrain.data import ShardStream, build_augment
from eigtrain.data.augment import PRESETS
from eigtrain.schema import DataConfig

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities", category=DeprecationWarning)


def write_jpeg_shards(directory: str, n: int, size: int, per_shard: int, seed: int = 0) -> str:
    """Smooth random RGB JPEGs (upsampled noise: file sizes close to natural images); returns the brace pattern."""
    rng = np.random.default_rng(seed)
    with wds.ShardWriter(os.path.join(directory, "bench-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(n):
            coarse = rng.integers(0, 256, (max(size // 8, 2), max(size // 8, 2), 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(coarse).resize((size, size), Image.BICUBIC).save(buffer, format="JPEG", quality=90)
            sink.write({"__key__": f"img-{i:07d}", "jpg": buffer.getvalue(), "cls": i % 10})
    shards = -(-n // per_shard)
    return os.path.join(directory, f"bench-{{000000..{shards - 1:06d}}}.tar")


def pil_views(preset: str, size: int):
    """The preset's two views as per-image v2 pipelines on PIL images (open_clip's style), normalized tensors."""
    return torchvision_views(preset, size, pil_input=True, interpolation=v2.InterpolationMode.BICUBIC)


class TwoViews:
    def __init__(self, preset, size):
        self.views = pil_views(preset, size)

    def __call__(self, image):
        return self.views[0](image), self.views[1](image)


def timed(make_batches, count: int, size_of) -> float:
    """images/s over `count` batches, worker start-up included: nothing is produced before the clock starts
    (a DataLoader prefetches, so timing after a first batch would count batches made while waiting for it)."""
    start, images = time.perf_counter(), 0
    batches = make_batches()
    for _ in range(count):
        images += size_of(next(batches))
    return images / (time.perf_counter() - start)


def ours(pattern, args, size, workers: int, augment=None) -> float:
    """ShardStream; with `augment` both views are made in this process on the CPU."""
    data = DataConfig(shards=pattern, num_workers=workers, label_key="cls", image_size=size, image_fit="whole")
    stream = ShardStream(data, batch_size=args.batch, seed=0)
    generator = torch.Generator().manual_seed(0)

    def size_of(batch):
        if augment is not None:
            augment(batch["image"], generator, sizes=batch["size"])
        return len(batch["key"])

    return timed(lambda: iter(stream), args.batches, size_of)


def webdataset_v2(pattern, args, size, workers: int) -> float:
    dataset = (
        wds.WebDataset(
            pattern, shardshuffle=False, nodesplitter=None, workersplitter=wds.split_by_worker, empty_check=False
        )
        .shuffle(1000)
        .decode("pilrgb")
        .to_tuple("jpg", "cls")
        .map_tuple(TwoViews(args.preset, size), lambda c: c)
        .batched(args.batch)
    )
    return timed(
        lambda: iter(DataLoader(dataset, batch_size=None, num_workers=workers)),
        args.batches,
        lambda batch: len(batch[1]),
    )


def members_us(pattern: str, repeats: int) -> dict:
    """Reading the shards' members alone (no decoding), us per member, webdataset's tarfile-based reader vs
    eigtrain's (plain ustar headers read directly), alternating, best of `repeats`."""
    from braceexpand import braceexpand
    from webdataset.tariterators import tar_file_iterator

    from eigtrain.data.tar_members import tar_files

    urls = list(braceexpand(pattern))
    readers = {"webdataset_tarfile": tar_file_iterator, "eigtrain": tar_files}
    best = {name: float("inf") for name in readers}
    for _ in range(max(repeats, 3)):
        for name, read in readers.items():
            start, count = time.perf_counter(), 0
            for url in urls:
                with open(url, "rb") as f:
                    count += sum(1 for _ in read(f))
            best[name] = min(best[name], 1e6 * (time.perf_counter() - start) / count)
    return {
        **{k: round(v, 1) for k, v in best.items()},
        "ratio_webdataset_vs_eigtrain": round(best["webdataset_tarfile"] / best["eigtrain"], 1),
    }


def one_core(cores, run):
    """`run()` pinned to the first of `cores` (and back)."""
    os.sched_setaffinity(0, cores[:1])
    try:
        return run()
    finally:
        os.sched_setaffinity(0, cores)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[96, 224])
    parser.add_argument("--preset", default="imagenet", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8, help="timed batches per loader run")
    parser.add_argument("--cores", type=int, default=2, help="pin this process and its workers to this many CPUs")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    os.sched_setaffinity(0, cores)  # DataLoader workers inherit it: all pipelines get the same CPUs
    args.cores = len(cores)
    torch.set_num_threads(1)  # one thread in this process; DataLoader workers run one each
    results = {}
    for size in args.sizes:
        augment = build_augment(args.preset, image_size=size)
        with tempfile.TemporaryDirectory() as tmp:
            n = args.batch * (args.batches + 2) * args.cores * 2  # every worker has batches to spare
            pattern = write_jpeg_shards(tmp, n, size, per_shard=max(n // (4 * args.cores), 1))
            runs = {"ours_one_core": [], "webdataset_v2_one_core": [], "ours_loader": [], "webdataset_v2": []}
            for _ in range(args.repeats):
                runs["ours_one_core"].append(one_core(cores, lambda: ours(pattern, args, size, 0, augment)))
                runs["webdataset_v2_one_core"].append(one_core(cores, lambda: webdataset_v2(pattern, args, size, 0)))
                runs["ours_loader"].append(ours(pattern, args, size, args.cores))
                runs["webdataset_v2"].append(webdataset_v2(pattern, args, size, args.cores))
            members = one_core(cores, lambda: members_us(pattern, args.repeats))
        median = {k: statistics.median(v) for k, v in runs.items()}
        per_core = {k: v / (1 if k.endswith("one_core") else args.cores) for k, v in median.items()}
        results[f"{size}px"] = {
            **{f"{k}_images_per_s_per_core": round(v, 1) for k, v in per_core.items()},
            "ratio_all_on_one_core_ours_vs_webdataset_v2": round(
                per_core["ours_one_core"] / per_core["webdataset_v2_one_core"], 2
            ),
            "ratio_loader_ours_vs_webdataset_v2": round(per_core["ours_loader"] / per_core["webdataset_v2"], 2),
            "runs_images_per_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
            "tar_members_us_per_member_one_core": members,
        }
    print(
        json.dumps(
            {
                "config": {**vars(args), "cores": cores, "load_average_1min": os.getloadavg()[0]},
                "two_views_per_image": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
