"""GPU training throughput and MFU of the trainer's step, against a bare torchvision reference; prints JSON.

For each case (model, image size, batch) it times the trainer's own step (uint8 batch -> device -> augmentation ->
encoder under bf16 autocast on both views -> objective in fp32 -> backward -> guarded optimizer update) in modes:
  - synthetic: one uint8 batch that already lives on the GPU (no loader, no copy): the trainer's compute-bound rate;
  - reference: bare torchvision <model> forward + backward of both views (2 x batch tensors in memory, bf16
    autocast, channels_last, SGD): the compute ceiling the trainer is compared with;
  - jpeg: the training loader over JPEG shards, decoded by nvJPEG on the GPU (data.decode=cuda) + GPU augmentation;
  - png: the training loader over PNG shards (decoded in the loader workers);
  - ddp: the synthetic step with the model inside DistributedDataParallel (a 1-rank group), against bare.
images/s counts images (each gives 2 views), so every mode is comparable; MFU = 3 x forward FLOPs (torch's
FlopCounterMode) / step time / the GPU's dense bf16 peak. Targets (issue 24): the step from shards >= 85 % of the
reference; ResNet-50 at 224 px >= 2,500 images/s on one H100.

    python tools/bench_gpu.py                                   # resnet18:32:512 and resnet50:224:256
    python tools/bench_gpu.py --cases resnet50:224:256 --modes synthetic,reference --steps 50
    python tools/bench_gpu.py --dry-run                         # CPU, every mode tiny (plumbing only)

--out FILE writes the JSON after every measurement (a step killed by its time box keeps what it measured);
--budget-s stops starting new measurements after that many seconds (the rest are listed as skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
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
MODES = ("synthetic", "reference", "jpeg", "png", "ddp")


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756.0
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def write_image_shards(root: Path, size: int, n: int, fmt: str = "jpg") -> Path:
    """A labelled image folder of random images (smooth noise, so JPEG compresses them like photos) as eigtrain
    shards in `fmt` (jpg or png: the bytes are stored as written)."""
    from PIL import Image

    from eigtrain.data.write import main as write_shards_cli

    rng = np.random.default_rng(0)
    folder = root / "folder"
    for split, count in (("train", n), ("val", max(8, n // 8))):
        for i in range(count):
            low = rng.integers(0, 256, (size // 8 + 1, size // 8 + 1, 3), dtype=np.uint8)
            image = Image.fromarray(low).resize((size, size), Image.BILINEAR)
            path = folder / split / f"c{i % 10}" / f"{i}.{fmt}"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path, **({"quality": 90} if fmt == "jpg" else {}))
    write_shards_cli(["source=imagefolder", f"path={folder}", f"out={root / 'shards'}", "shard_size=256"])
    return root / "shards"


def case_config(
    model: str,
    size: int,
    batch: int,
    compile: bool,
    workers: int,
    root: Path | str = "unused",
    extra: tuple[str, ...] = (),
):
    augment = "cifar" if size <= 64 else "imagenet"
    overrides = [
        f"model={model}",
        f"batch_size={batch}",
        "objective=scl",
        f"data.root={root}",
        f"data.augment={augment}",
        "data.write_if_missing=null",
        f"engine.compile={str(compile).lower()}",
        f"data.num_workers={workers}",
        f"data.image_size=[{size},{size}]",
        "data.mean=[0.5,0.5,0.5]",
        "data.std=[0.25,0.25,0.25]",
        "engine.precision=auto",
        "engine.channels_last=true",
        *extra,
    ]
    if model.startswith("resnet") and size <= 64:
        overrides.append("model.cifar_stem=true")
    return compose_config(overrides)


def trainer_pieces(cfg, size: int, batch: int, device: torch.device):
    torch.manual_seed(0)
    encoder = build_encoder(cfg.model, cfg.dim, (3, size, size))
    engine = build_engine(cfg.engine, cfg.optim, encoder, device=device, micro_batch_size=batch, grad_accum_steps=1)
    objective = build_objective("scl", cfg.dim).to(device)
    views = build_augment(cfg.data.augment, mean=tuple(cfg.data.mean), std=tuple(cfg.data.std)).to(device)
    return engine, make_loss_fn(engine, objective, pairs=False), views


def forward_flops(model, x: torch.Tensor, autocast) -> float:
    """FLOPs of one forward pass over x (torch's counter: 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad(), autocast():
        model(x)
    return float(counter.get_total_flops())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_per_step(step, steps: int, warmup: int, device: torch.device) -> float:
    for _ in range(warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps


def trainer_step(engine, loss_fn, views, batches, device: torch.device):
    generator = torch.Generator(device=device).manual_seed(0)

    def step():
        images = next(batches).to(device, non_blocking=True)
        first, second = views(images, generator=generator)
        engine.train_step(list(zip(chunks(first, 1), chunks(second, 1))), loss_fn, lr=0.01)

    return step


def reference_model(model: str, size: int, dim: int) -> torch.nn.Module:
    """Bare torchvision model (CIFAR stem at small sizes, as eigtrain's), dim outputs."""
    import torchvision

    net = getattr(torchvision.models, model)(num_classes=dim)
    if size <= 64:
        net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
    return net


def reference_step(model: str, size: int, batch: int, dim: int, device: torch.device):
    net = reference_model(model, size, dim).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2 * batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda")  # noqa: E731

    def step():
        with autocast():
            loss = net(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, forward_flops(net, x, autocast)


def one_rank_group(device: torch.device) -> None:
    """A process group of one rank (nccl on CUDA, gloo on the CPU) for the DDP wrapper."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=0,
        world_size=1,
        **({"device_id": device} if device.type == "cuda" else {}),
    )


class Report:
    """The JSON report, written to --out after every measurement."""

    def __init__(self, out: Path | None, head: dict, budget_s: float | None):
        self.out, self.data, self.budget_s, self.t0 = out, {**head, "results": [], "skipped": []}, budget_s, time.time()

    def over_budget(self, what: str) -> bool:
        over = self.budget_s is not None and time.time() - self.t0 > self.budget_s
        if over:
            self.data["skipped"].append(what)
            self.write()
        return over

    def write(self) -> None:
        if self.out:
            tmp = self.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            tmp.replace(self.out)


def bench_case(
    model: str,
    size: int,
    batch: int,
    modes: list[str],
    shards: dict,
    device: torch.device,
    steps: int,
    warmup: int,
    compile: bool,
    peak: float | None,
    workers: int,
    report: Report,
) -> None:
    case = {"model": model, "image_size": size, "batch": batch, "steps": steps, "compile": compile, "modes": {}}
    report.data["results"].append(case)
    base = case_config(model, size, batch, compile, workers)
    engine, loss_fn, views = trainer_pieces(base, size, batch, device)
    x = torch.zeros(2 * batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    trainer_flops = 3.0 * forward_flops(engine.model, x, engine.autocast)
    del x

    def record(mode: str, step_s: float, flops: float, **extra) -> None:
        entry = {
            "images_per_s": batch / step_s,
            "seconds_per_step": step_s,
            "train_tflops_per_step": flops / 1e12,
            "mfu": flops / step_s / (peak * 1e12) if peak else None,
            **extra,
        }
        case["modes"][mode] = entry
        report.write()
        print(f"bench_gpu: {model}@{size} b{batch} {mode}: {entry['images_per_s']:,.0f} images/s", flush=True)

    def loader(fmt: str):
        decode = ["data.decode=cuda"] if fmt == "jpeg" and device.type == "cuda" else []
        cfg = case_config(model, size, batch, compile, workers, shards[fmt](), tuple(decode))
        stream = data_setup.build_stream(cfg.data, batch_size=batch, rank=0, world_size=1, seed=0, device=device)
        return (b["image"] for b in stream)

    resident = None

    def measure(mode: str) -> None:
        nonlocal resident
        if mode in ("synthetic", "ddp") and resident is None:
            batches = loader("jpeg")
            resident = next(batches).to(device)  # the same batch every step, already on the device
            del batches
        if mode == "synthetic":
            record(
                mode,
                seconds_per_step(
                    trainer_step(engine, loss_fn, views, iter(lambda: resident, None), device), steps, warmup, device
                ),
                trainer_flops,
            )
        elif mode == "reference":
            step, fwd = reference_step(model, size, batch, base.dim, device)
            record(mode, seconds_per_step(step, steps, warmup, device), 3.0 * fwd)
        elif mode in ("jpeg", "png"):
            batches = loader(mode)
            record(
                mode,
                seconds_per_step(trainer_step(engine, loss_fn, views, batches, device), steps, warmup, device),
                trainer_flops,
                data_bound_share=None,
            )
            del batches
            synthetic = case["modes"].get("synthetic")
            if synthetic and "seconds_per_step" in synthetic:
                mine = case["modes"][mode]
                mine["data_bound_share"] = max(0.0, 1.0 - synthetic["seconds_per_step"] / mine["seconds_per_step"])
        elif mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            one_rank_group(device)
            bare = engine.train_module
            engine.train_module = DistributedDataParallel(
                engine.model, device_ids=[device.index] if device.type == "cuda" else None
            )
            try:
                s = seconds_per_step(
                    trainer_step(engine, loss_fn, views, iter(lambda: resident, None), device), steps, warmup, device
                )
            finally:
                engine.train_module = bare
            synthetic = case["modes"].get("synthetic", {}).get("seconds_per_step")
            record(mode, s, trainer_flops, vs_bare=synthetic / s if synthetic else None)

    for mode in modes:
        if report.over_budget(f"{model}@{size} {mode}"):
            continue
        try:
            measure(mode)
        except Exception as e:  # one broken path must not cost the other figures: recorded, the run goes on
            case["modes"][mode] = {"error": f"{type(e).__name__}: {e}"[:400]}
            report.data["errors"] = report.data.get("errors", 0) + 1
            report.write()
            print(f"bench_gpu: {model}@{size} b{batch} {mode}: FAILED {type(e).__name__}: {e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="resnet18:32:512,resnet50:224:256", help="model:image_size:batch, ...")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma separated, of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--images", type=int, default=2048, help="train images of the generated shards")
    parser.add_argument("--compile", action="store_true", help="engine.compile=true")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="loader workers")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: by name)")
    parser.add_argument("--budget-s", type=float, default=None, help="start no measurement after this many seconds")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here after every measurement")
    parser.add_argument("--dry-run", action="store_true", help="CPU, every mode with ResNet-18 at 16 px, batch 4")
    args = parser.parse_args()

    device = torch.device("cuda", 0) if torch.cuda.is_available() and not args.dry_run else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        enable_cuda_fast_paths()
    head = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "peak_bf16_tflops": peak_tflops(device, args.peak_tflops),
    }
    report = Report(args.out, head, args.budget_s)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"bench_gpu: unknown modes {unknown}; known: {', '.join(MODES)}")
    if args.dry_run:
        cases, steps, warmup, images, workers = [("resnet18", 16, 4)], 1, 1, 16, 0
    else:
        cases = [(m, int(s), int(b)) for m, s, b in (c.split(":") for c in args.cases.split(","))]
        steps, warmup, images, workers = args.steps, args.warmup, args.images, args.workers
    with tempfile.TemporaryDirectory() as tmp:
        made: dict = {}

        def shards_of(fmt: str, size: int, batch: int):  # written on first use only
            # the loader wants one whole batch per worker at least (H200, 2026-11-26: 2,048 images were too few
            # for ResNet-18 b512 with 8 workers)
            count = max(images, batch * max(workers, 1))
            key = (fmt, size, count)
            if key not in made:
                made[key] = write_image_shards(
                    Path(tmp) / f"{fmt}{size}-{count}", size, count, "jpg" if fmt == "jpeg" else fmt
                )
            return made[key]

        for model, size, batch in cases:
            shards = {
                fmt: (lambda fmt=fmt, size=size, batch=batch: shards_of(fmt, size, batch)) for fmt in ("jpeg", "png")
            }
            try:
                bench_case(
                    model,
                    size,
                    batch,
                    modes,
                    shards,
                    device,
                    steps,
                    warmup,
                    args.compile,
                    head["peak_bf16_tflops"],
                    workers,
                    report,
                )
            except Exception as e:  # e.g. the model does not fit: the next case still runs
                report.data["results"].append(
                    {
                        "model": model,
                        "image_size": size,
                        "batch": batch,
                        "modes": {},
                        "error": f"{type(e).__name__}: {e}"[:400],
                    }
                )
                report.data["errors"] = report.data.get("errors", 0) + 1
                report.write()
                print(f"bench_gpu: {model}@{size} b{batch}: FAILED {type(e).__name__}: {e}", flush=True)
    report.write()
    print(json.dumps(report.data, indent=1))
    if report.data.get("errors"):
        raise SystemExit(f"bench_gpu: {report.data['errors']} measurements failed (their errors are in the JSON)")


if __name__ == "__main__":
    main()
