"""GPU training throughput and MFU of the trainer's step, against a bare torchvision reference in the same mode; JSON.

For each case (model, image size, batch) it times the trainer's own step (uint8 batch -> device -> augmentation
(`StepInputs`, as the trainer) -> encoder under bf16 autocast on both views -> objective in fp32 -> backward ->
guarded optimizer update) in modes:
  - synthetic: one uint8 batch that already lives on the GPU (no loader, no copy): the trainer's compute-bound rate;
  - reference: bare torchvision <model> forward + backward of both views (2 x batch tensors in memory, bf16
    autocast, channels_last, SGD), compiled when the trainer is (--compile): the ceiling the trainer is compared with;
  - jpeg: the training loader over JPEG shards, data.decode=auto (nvJPEG on the GPU above 64 px, on the decode-ahead
    thread; else the workers);
  - jpeg_workers: the same JPEG shards with data.decode=cpu (decoded in the loader workers, as PNG shards are):
    which of the two placements keeps up with the step at this size;
  - png: the training loader over PNG shards (decoded in the loader workers);
  - ddp: the synthetic step with the model inside DistributedDataParallel (a 1-rank group), against bare;
  - components: the synthetic step's parts, each timed alone: augment_only (StepInputs: both views from the batch)
    and step_on_made_views (engine.train_step on views made once: encoder, objective, backward, update), so the
    gap to the reference splits into augmentation and the rest;
  - presets: no timing: host synchronisations of the augmentation alone, for every preset (CUDA sync-debug mode);
  - augment_forms: the augmentation alone (both views, compiled on CUDA) in its reference (grid_sample, grouped
    convolutions) and fusable forms side by side, with the top kernels of each (tools/bench_augment.py).
Each timed mode: --repeats runs of --steps steps (CUDA events), after --warmup steps; the median and the spread
((slowest - fastest) / median) of the seconds per step; views/s (2 per pair) and pairs/s; MFU = 3 x forward FLOPs
(torch's FlopCounterMode) / step time / the GPU's dense bf16 peak; host syncs per step (3 more steps under sync-debug
mode). Targets (issue 37): the step >= 90 % of the same-mode reference in memory, >= 85 % from shards; ResNet-50
224 px bf16 compiled >= 5,500 views/s on one H100.

    python tools/bench_gpu.py                                   # resnet18:32:512 and resnet50:224:256
    python tools/bench_gpu.py --cases resnet50:224:256 --modes synthetic,reference --compile
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from bench_augment import compare_forms
from bench_timing import driver_device_name, host_syncs_per_step, summary, sync_sources, timed_repeats

from eigtrain.data import build_augment
from eigtrain.data import from_config as data_setup
from eigtrain.data.augment_draws import Sampler
from eigtrain.data.augment_recipes import PRESETS
from eigtrain.engine import build_engine
from eigtrain.engine import compile_mode as resolve_compile_mode
from eigtrain.engine.base import enable_cuda_fast_paths
from eigtrain.models import build_encoder
from eigtrain.objectives import build_objective
from eigtrain.schema import train_config
from eigtrain.train.command import compose_config
from eigtrain.train.step_inputs import StepInputs, make_loss_fn, view_options

# Dense bf16 tensor-core peaks (TFLOP/s) by device name; --peak-tflops overrides.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "V100": 125.0}
MODES = ("presets", "synthetic", "reference", "jpeg", "jpeg_workers", "png", "ddp", "components", "augment_forms")
# what `components` records: the step's parts, each timed alone (rows beside the step, no targets of their own)
COMPONENTS = ("augment_only", "step_on_made_views")


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and "PCIe" in name:
        return 756.0
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _write_images(args) -> None:
    folder, size, fmt, first, count, seed = args
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(first, first + count):
        low = rng.integers(0, 256, (size // 8 + 1, size // 8 + 1, 3), dtype=np.uint8)
        image = Image.fromarray(low).resize((size, size), Image.BILINEAR)
        path = folder / f"c{i % 10}" / f"{i}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, **({"quality": 90} if fmt == "jpg" else {}))


def write_image_shards(root: Path, size: int, n: int, fmt: str = "jpg", processes: int = 1) -> Path:
    """A labelled image folder of random images (smooth noise, so JPEG compresses them like photos) as eigtrain
    shards in `fmt` (jpg or png: the bytes are stored as written); images written by `processes` processes."""
    from eigtrain.data.write import main as write_shards_cli

    folder = root / "folder"
    jobs = []
    for seed, (split, count) in enumerate((("train", n), ("val", max(8, n // 8)))):
        per = -(-count // max(1, processes))
        jobs += [(folder / split, size, fmt, a, min(per, count - a), 1000 * seed + a) for a in range(0, count, per)]
    if processes > 1:
        with ProcessPoolExecutor(processes) as pool:
            list(pool.map(_write_images, jobs))
    else:
        for job in jobs:
            _write_images(job)
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
    compile_mode: str = "auto",
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
        f"engine.compile_mode={compile_mode}",
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
    return train_config(compose_config(overrides))


def trainer_pieces(cfg, size: int, batch: int, device: torch.device):
    torch.manual_seed(0)
    encoder = build_encoder(cfg.model, cfg.dim, (3, size, size))
    engine = build_engine(
        cfg.engine, cfg.optim, encoder, device=device, micro_batch_size=batch, grad_accum_steps=1, view_hw=[size, size]
    )
    objective = build_objective("scl", cfg.dim).to(device)
    mean, std = tuple(cfg.data.mean), tuple(cfg.data.std)
    augment = build_augment(cfg.data.augment, mean=mean, std=std, **view_options(cfg.data, engine)).to(device)
    generator = torch.Generator(device=device).manual_seed(0)
    inputs = StepInputs(
        augment,
        generator,
        device,
        pairs=False,
        accum=1,
        split_batch=objective.split_batch,
        channels_last=engine.channels_last,
    )
    return engine, make_loss_fn(engine, objective, pairs=False), inputs


def forward_flops(model, x: torch.Tensor, autocast) -> float:
    """FLOPs of one forward pass over x (torch's counter: 2 per multiply-add)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad(), autocast():
        model(x)
    return float(counter.get_total_flops())


def trainer_step(engine, loss_fn, inputs: StepInputs, batches, device: torch.device):
    """The trainer's step (eigtrain.train.command's loop body without its logging): inputs, then engine.train_step."""

    def step():
        micro_batches, usable = inputs({"image": next(batches)})
        engine.train_step(micro_batches, loss_fn, lr=0.01, usable=usable)

    return step


def reference_model(model: str, size: int, dim: int) -> torch.nn.Module:
    """Bare torchvision model (CIFAR stem at small sizes, as eigtrain's), dim outputs."""
    import torchvision

    net = getattr(torchvision.models, model)(num_classes=dim)
    if size <= 64:
        net.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        net.maxpool = torch.nn.Identity()
    return net


def reference_step(model: str, size: int, batch: int, dim: int, device: torch.device, compile: bool, mode: str):
    """The bare model's training step on both views (2 x batch), compiled like the trainer's encoder when it is."""
    net = reference_model(model, size, dim).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2 * batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = lambda: torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda")  # noqa: E731
    flops = forward_flops(net, x, autocast)
    module = torch.compile(net, mode=mode) if compile else net

    def step():
        if compile and mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        with autocast():
            loss = module(x).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, flops


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


def device_ops(call, device: torch.device) -> int | None:
    """Kernels (and copies) one call puts on the GPU, counted by the profiler; None on the CPU."""
    if device.type != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)


def preset_checks(batch: torch.Tensor, device: torch.device, compiled_preset: str, options: dict) -> dict:
    """For every augmentation preset alone (both views of `batch`, eager): host synchronisations per call (and where
    from) and GPU kernels per call; for the case's own preset (`options`: the trainer's, so the compiled graph is
    shared with its step) also compiled: syncs, kernels, compile seconds and the largest |compiled - eager|."""
    out = {}
    generator = torch.Generator(device=device).manual_seed(0)
    for preset in PRESETS:
        images = batch[:, : 1 if preset == "digits" else 3].contiguous()
        view = {**options, "compile": False}
        eager = build_augment(preset, **view).to(device)
        call = lambda: eager(images, generator=generator)  # noqa: E731
        found = {
            "host_syncs_per_call": host_syncs_per_step(call, device),
            "from": sync_sources(call, device),
            "gpu_ops_per_call_eager": device_ops(call, device),
        }
        if preset == compiled_preset and options.get("compile"):
            compiled = build_augment(preset, **options).to(device)
            block = torch.rand(images.shape[0], Sampler.BLOCK, device=device, generator=generator)
            t0 = time.perf_counter()
            views = [compiled.batched(images, block, i) for i in (0, 1)]  # compiles here (or falls back, warning)
            found["compile_s"] = time.perf_counter() - t0
            found["compiled"] = compiled.compile_views  # (nn.Module.compile is a method)
            diffs = [
                (v.float() - eager.batched(images, block, i).float()).abs().max().item() for i, v in enumerate(views)
            ]
            call = lambda: compiled(images, generator=generator)  # noqa: E731
            found.update(
                max_abs_compiled_minus_eager=max(diffs),
                host_syncs_per_call_compiled=host_syncs_per_step(call, device),
                gpu_ops_per_call_compiled=device_ops(call, device),
            )
        out[preset] = found
    return out


@dataclass
class Timing:
    steps: int
    repeats: int
    warmup: int


def bench_case(
    model: str,
    size: int,
    batch: int,
    modes: list[str],
    shards: dict,
    device: torch.device,
    timing: Timing,
    compile: bool,
    peak: float | None,
    workers: int,
    report: Report,
    compile_mode: str = "auto",
) -> None:
    case = {
        "model": model,
        "image_size": size,
        "batch": batch,
        "steps": timing.steps,
        "repeats": timing.repeats,
        "warmup": timing.warmup,
        "compile": compile,
        # the mode the step ran in (auto resolved by the view size, as the trainer resolves it) and the one asked for
        "compile_mode": resolve_compile_mode(compile_mode, device, "ddp", 1, [size, size]) if compile else None,
        "compile_mode_setting": compile_mode if compile else None,
        "modes": {},
    }
    report.data["results"].append(case)
    base = case_config(model, size, batch, compile, workers, compile_mode=compile_mode)
    engine, loss_fn, inputs = trainer_pieces(base, size, batch, device)
    x = torch.zeros(2 * batch, 3, size, size, device=device).to(memory_format=torch.channels_last)
    trainer_flops = 3.0 * forward_flops(engine.model, x, engine.autocast)
    del x

    def record(mode: str, step, flops: float, **extra) -> None:
        seconds = timed_repeats(step, timing.steps, timing.repeats, timing.warmup, device)
        entry = {**summary(seconds, batch), "train_tflops_per_step": flops / 1e12, **extra}
        entry["mfu"] = flops / entry["seconds_per_step"] / (peak * 1e12) if peak and flops else None
        case["modes"][mode] = entry
        report.write()
        entry["host_syncs_per_step"] = host_syncs_per_step(step, device)
        if entry["host_syncs_per_step"]:
            entry["host_sync_sources"] = sync_sources(step, device)
        report.write()
        print(
            f"bench_gpu: {model}@{size} b{batch} {mode}: {entry['views_per_s']:,.0f} views/s "
            f"(spread {entry['spread']:.1%}), {entry['host_syncs_per_step']} host syncs/step",
            flush=True,
        )

    def loader(mode: str):
        fmt = "png" if mode == "png" else "jpeg"
        auto = mode == "jpeg" and device.type == "cuda"  # nvJPEG above 64 px; jpeg_workers: the default, decode=cpu
        decode = ("data.decode=auto",) if auto else ("data.decode=cpu",)
        cfg = case_config(model, size, batch, compile, workers, shards[fmt](), decode, compile_mode)
        stream = data_setup.build_stream(cfg.data, batch_size=batch, rank=0, world_size=1, seed=0, device=device)
        ahead = stream.jpeg_device is not None
        where = (
            f"nvJPEG on {stream.jpeg_device}, decode-ahead thread"
            if ahead
            else f"on the CPU by the loader ({workers} workers)"
        )
        return (b["image"] for b in stream), where

    resident = None

    def measure(mode: str) -> None:
        nonlocal resident
        if mode in ("synthetic", "ddp", "presets", "components", "augment_forms") and resident is None:
            batches, _ = loader("jpeg")
            resident = next(batches).to(device)  # the same batch every step, already on the device
            del batches
        same = iter(lambda: resident, None)
        if mode == "presets":
            options = view_options(base.data, engine)
            case["modes"][mode] = {"presets": preset_checks(resident, device, base.data.augment, options)}
            report.write()
        elif mode == "synthetic":
            record(mode, trainer_step(engine, loss_fn, inputs, same, device), trainer_flops)
        elif mode == "components":  # the synthetic step = augmentation + the rest: which part is the gap to bare
            made, usable = inputs({"image": resident})
            record("augment_only", lambda: inputs({"image": resident}), 0.0)
            record(
                "step_on_made_views", lambda: engine.train_step(made, loss_fn, lr=0.01, usable=usable), trainer_flops
            )
        elif mode == "augment_forms":  # compiled as the trainer compiles it (on CUDA; eager on the CPU dry run)
            compiled = inputs.augment.compile_views and device.type == "cuda"
            case["modes"][mode] = compare_forms(inputs.augment, resident, device, timing, compiled)
            report.write()
        elif mode == "reference":
            step, fwd = reference_step(model, size, batch, base.dim, device, compile, case["compile_mode"] or "default")
            record(mode, step, 3.0 * fwd)
        elif mode in ("jpeg", "jpeg_workers", "png"):
            batches, decoded_in = loader(mode)
            record(mode, trainer_step(engine, loss_fn, inputs, batches, device), trainer_flops, decoded_in=decoded_in)
            del batches
        elif mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            one_rank_group(device)
            bare = engine.train_module
            wrapped = DistributedDataParallel(
                engine.model, device_ids=[device.index] if device.type == "cuda" else None
            )
            engine.train_module = torch.compile(wrapped) if compile else wrapped
            try:
                record(mode, trainer_step(engine, loss_fn, inputs, same, device), trainer_flops)
            finally:
                engine.train_module = bare

    for mode in modes:
        if report.over_budget(f"{model}@{size}{' compiled' if compile else ''} {mode}"):
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
    parser.add_argument("--steps", type=int, default=100, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--images", type=int, default=2048, help="train images of the generated shards")
    parser.add_argument("--compile", action="store_true", help="engine.compile=true, and the reference compiled")
    parser.add_argument(
        "--compile-mode",
        default="auto",
        help="engine.compile_mode (and the reference's, resolved as the trainer resolves it), e.g. reduce-overhead",
    )
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
        **driver_device_name(device),
        "torch": torch.__version__,
        "peak_bf16_tflops": peak_tflops(device, args.peak_tflops),
        "timer": "cuda events" if device.type == "cuda" else "wall clock",
    }
    report = Report(args.out, head, args.budget_s)
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"bench_gpu: unknown modes {unknown}; known: {', '.join(MODES)}")
    if args.dry_run:
        cases, timing, images, workers = [("resnet18", 16, 4)], Timing(1, 2, 1), 16, 0
    else:
        cases = [(m, int(s), int(b)) for m, s, b in (c.split(":") for c in args.cases.split(","))]
        timing, images, workers = Timing(args.steps, args.repeats, args.warmup), args.images, args.workers
    with tempfile.TemporaryDirectory() as tmp:
        made: dict = {}

        def shards_of(fmt: str, size: int, batch: int):  # written on first use only
            # the loader wants one whole batch per worker at least (H200, 2026-11-26: 2,048 images were too few
            # for ResNet-18 b512 with 8 workers)
            count = max(images, batch * max(workers, 1))
            key = (fmt, size, count)
            if key not in made:
                made[key] = write_image_shards(
                    Path(tmp) / f"{fmt}{size}-{count}",
                    size,
                    count,
                    "jpg" if fmt == "jpeg" else fmt,
                    processes=max(1, min(8, (os.cpu_count() or 1) // 2)),
                )
            return made[key]

        for model, size, batch in cases:
            shards = {
                fmt: (lambda fmt=fmt, size=size, batch=batch: shards_of(fmt, size, batch)) for fmt in ("jpeg", "png")
            }
            try:
                bench_case(
                    model, size, batch, modes, shards, device, timing, args.compile, head["peak_bf16_tflops"],
                    workers, report, args.compile_mode,
                )  # fmt: skip
            except Exception as e:  # e.g. the model does not fit: the next case still runs
                report.data["results"].append(
                    {
                        "model": model,
                        "image_size": size,
                        "batch": batch,
                        "compile": args.compile,
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
