"""The augmentation alone in its two compiled forms, side by side (issue 37; tools/bench_gpu.py --modes augment_forms):
`reference` (grid_sample and grouped convolutions, as before 2026-11-27) and `fusable` (`augment_fusable`: gathers
and shifted slices that Inductor fuses; what the trainer compiles now). Both views of one resident uint8 batch from
the same random blocks: seconds per call, compile seconds, the largest |fusable - reference| and the top kernels by
device time (torch.profiler; the top CPU operations on the CPU). Plain JSON."""

from __future__ import annotations

import time
from collections import defaultdict

import torch
from bench_timing import summary, timed_repeats

from eigtrain.data.augment_batched import batched_view, compiled_view
from eigtrain.data.augment_draws import Sampler

FORMS = {"reference": False, "fusable": True}  # form -> batched_view(fusable=...)
TOP = 15  # kernels listed per form


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def view_calls(augment, images: torch.Tensor, blocks: list[torch.Tensor], fusable: bool, compile: bool):
    """Both views of `images` in one form: the trainer's compiled function (compile) or the eager one."""
    size = tuple(augment.image_size or images.shape[-2:])
    options = (size, augment.dtype, augment.channels_last)
    views = []
    for index, recipe in enumerate(augment.views):
        if compile:
            # the fusable form with the trainer's very arguments: its cached graph is the one the step then reuses
            views.append(compiled_view(recipe, *options) if fusable else compiled_view(recipe, *options, False))
        else:
            views.append(
                lambda i, b, s, m, d, recipe=recipe: batched_view(
                    i, b, s, m, d, recipe=recipe, size=size, dtype=options[1], channels_last=options[2],
                    fusable=fusable,
                )
            )  # fmt: skip
    return lambda: [view(images, blocks[i], None, augment.mean, augment.std) for i, view in enumerate(views)]


def top_kernels(call, device: torch.device, calls: int = 5) -> dict:
    """The operations that take the time of one call: CUDA kernels by device time (as bench_gpu.device_ops counts
    them; CPU operators by self CPU time without CUDA), per call, the largest first, with their total and count."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        _sync(device)
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    if cuda:
        for event in prof.events():
            if event.device_type == DeviceType.CUDA:
                totals[event.name][0] += event.time_range.elapsed_us()
                totals[event.name][1] += 1
    else:
        for avg in prof.key_averages():
            totals[avg.key] = [avg.self_cpu_time_total, avg.count]
    rows = [
        {"name": str(name)[:160], "us_per_call": float(us) / calls, "count": count / calls}
        for name, (us, count) in totals.items()
        if us
    ]
    rows.sort(key=lambda r: -r["us_per_call"])
    return {
        "what": "CUDA kernels, device time" if cuda else "CPU operators, self CPU time",
        "total_us_per_call": sum(r["us_per_call"] for r in rows),
        "ops_per_call": sum(r["count"] for r in rows),
        "top": rows[:TOP],
    }


def compare_forms(augment, images: torch.Tensor, device: torch.device, timing, compile: bool) -> dict:
    """The two forms of both views of `images`, timed alike (timing: steps, repeats, warmup)."""
    generator = torch.Generator(device=device).manual_seed(0)
    blocks = [torch.rand(images.shape[0], Sampler.BLOCK, device=device, generator=generator) for _ in range(2)]
    found: dict = {"compiled": compile, "batch": images.shape[0], "image_shape": list(images.shape[1:])}
    made = {}
    for form, fusable in FORMS.items():
        call = view_calls(augment, images, blocks, fusable, compile)
        _sync(device)
        t0 = time.perf_counter()
        made[form] = call()  # compiles here
        _sync(device)
        compile_s = time.perf_counter() - t0
        seconds = timed_repeats(call, timing.steps, timing.repeats, timing.warmup, device)
        found[form] = {**summary(seconds, images.shape[0]), "first_call_s": compile_s}
        try:  # the profile must not cost the timings (a JSON or profiler surprise is recorded, the run goes on)
            found[form]["kernels"] = top_kernels(call, device)
        except Exception as e:
            found[form]["kernels"] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(
            f"bench_augment: {form}: {found[form]['seconds_per_step'] * 1e3:.2f} ms per call (both views)", flush=True
        )
    diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(made["fusable"], made["reference"])]
    found["max_abs_fusable_minus_reference"] = max(diffs)
    found["speedup"] = found["reference"]["seconds_per_step"] / found["fusable"]["seconds_per_step"]
    return found
