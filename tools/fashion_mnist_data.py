"""Fashion-MNIST for the recipes and tools/bench_fashion_mnist.py: Debian's idx files (package
dataset-fashion-mnist) read with numpy, written as eigtrain shards in two layouts, and the raw-pixel floor.

    python tools/fashion_mnist_data.py [IDX_DIR]   # -> data/fashion_mnist (train 60,000 / val = the 10,000 test)
                                                   #    data/fashion_mnist_select (train 50,000 / val = the last
                                                   #    10,000 of train: the carve-out every setting is chosen on)

Until `eigtrain-shards source=idx` lands, this is how the shards are written (the official split, in file order
shuffled with a fixed seed); mean/std are given to the recipes explicitly (FASHION_MEAN/FASHION_STD below).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

IDX_DIR = Path(os.environ.get("FASHION_MNIST_IDX", "/usr/share/datasets/fashion-mnist"))  # a device: carry them
OUT = {"report": Path("data/fashion_mnist"), "select": Path("data/fashion_mnist_select")}
CARVE_OUT = 10_000  # the last 10,000 training images: the validation split every setting is chosen on
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530  # the 60,000 training images scaled to 0..1 (see pixel_stats)
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def load(idx_dir: Path = IDX_DIR) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": (images (60000, 28, 28), labels), "test": (images (10000, 28, 28), labels)}, read by eigtrain's
    idx source (malformed files refused in one line)."""
    from eigtrain.data.idx_files import read_split

    return {"train": read_split(idx_dir, "train"), "test": read_split(idx_dir, "t10k")}


def splits(layout: str, data: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The train/val pair of a layout: "report" (60,000 / the test set) or "select" (50,000 / the carve-out)."""
    images, labels = data["train"]
    if layout == "report":
        return {"train": (images, labels), "val": data["test"]}
    cut = len(images) - CARVE_OUT
    return {"train": (images[:cut], labels[:cut]), "val": (images[cut:], labels[cut:])}


def write(layout: str, data: dict, out: Path, seed: int = 0) -> None:
    from eigtrain.data.sources import png_bytes
    from eigtrain.data.write import write_shards

    rng = np.random.default_rng(seed)

    def samples(split, images, labels):
        for i in rng.permutation(len(images)):  # shuffled once: shards hold mixed classes
            yield {"__key__": f"fmnist-{split}-{i:05d}", "png": png_bytes(images[i]), "cls": int(labels[i])}

    parts = splits(layout, data)
    meta = dict(mode="views", channels=1, image_shape=[1, 28, 28], labels=True, num_classes=10, classes=CLASSES)
    write_shards(out, {s: samples(s, *parts[s]) for s in parts}, shard_size=5000, meta=meta)


def pixel_stats(data: dict) -> tuple[float, float]:
    images = data["train"][0].astype(np.float64) / 255
    return float(images.mean()), float(images.std())


if __name__ == "__main__":
    source = load(Path(sys.argv[1]) if len(sys.argv) > 1 else IDX_DIR)
    print("train pixels mean/std: %.4f / %.4f" % pixel_stats(source), flush=True)
    for name, path in OUT.items():
        if (path / "index.json").exists():
            print(f"{path} exists; kept", flush=True)
            continue
        write(name, source, path)
        print(f"wrote {path}", flush=True)
