"""The bodies of tools/gpu_check.py's steps that are more than one command (`gpu_check.py --impl NAME ...`).

Each runs in its own process under the step's time box, exits non-zero on failure and writes its figures as JSON to
$GPU_CHECK_FIGURES (the report shows them).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

QUIET = ["logging.wandb.mode=disabled", "logging.progress=false"]
RESNET = ["model=resnet18", "model.cifar_stem=true", "model.projector_hidden=512"]


def figures(**values) -> None:
    path = os.environ.get("GPU_CHECK_FIGURES")
    if path:
        Path(path).write_text(json.dumps(values, indent=1))


def train(runs: Path, *overrides: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "eigtrain.train.command",
        "experiment=cpu_debug",
        *QUIET,
        f"data.root={runs}/digits",
        "log_every=1",
        *overrides,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def losses(run_dir: Path) -> list[tuple[int, float]]:
    from eigtrain.train.metrics_log import read_metrics

    return [(m["step"], m["loss"]) for m in read_metrics(run_dir)]


def resume(runs: str, device: str, precision: str, rtol: str, *extra: str) -> int:
    """Stop after 2 steps and resume to 4 (2 accumulation steps each: the exact path); compare with one run.
    extra: more overrides for all three runs (engine.deterministic=true for the bit-identical check on CUDA)."""
    runs_dir, tol = Path(runs), float(rtol)
    args = [f"device={device}", f"engine.precision={precision}", "steps=4", "checkpoint_every=2", "micro_batch_size=32"]
    args += list(extra)
    ref, resumed = runs_dir / f"resume_{device}_{precision}_ref", runs_dir / f"resume_{device}_{precision}"
    train(runs_dir, *args, f"run_dir={ref}")
    train(runs_dir, *args, "stop_after=2", f"run_dir={resumed}")
    train(runs_dir, *args, f"run_dir={resumed}")
    a, b = losses(ref), losses(resumed)
    worst = max((abs(x - y) / max(abs(x), 1e-30) for (_, x), (_, y) in zip(a, b)), default=math.inf)
    same_steps = [s for s, _ in a] == [s for s, _ in b]
    ok = same_steps and (all(x == y for (_, x), (_, y) in zip(a, b)) if tol == 0 else worst <= tol)
    figures(losses_uninterrupted=a, losses_resumed=b, max_relative_difference=worst, tolerance=tol, passed=ok)
    print(f"resume {device} {precision}: {len(a)} losses, max relative difference {worst:.3g} (tolerance {tol})")
    return 0 if ok else 1


def host_syncs(runs: str, device: str = "cuda") -> int:
    """Host synchronisations per step under CUDA sync-debug mode, with hue jitter and image_fit=whole on PNG shards.

    Steps 2..20 neither log nor save (step 1 warms up, step 21 logs and saves): at most 1 sync each. On the CPU
    (the dry run): the same run, 5 steps of the tiny CNN, nothing counted (the plumbing only)."""
    import torch
    from bench_gpu import write_image_shards

    from eigtrain.train.command import compose_config, run
    from eigtrain.train.metrics_log import Throughput

    cuda = device == "cuda"
    root = write_image_shards(Path(runs) / "png40", 40, 256 if cuda else 64, "png")
    steps = 21 if cuda else 5
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            f"device={device}",
            *(RESNET if cuda else []),
            *QUIET,
            f"data.root={root}",
            "data.write_if_missing=null",
            "data.augment=cifar",
            "data.image_size=[32,32]",
            "data.image_fit=whole",
            "data.mean=[0.5,0.5,0.5]",
            "data.std=[0.25,0.25,0.25]",
            f"run_dir={runs}/syncs_{device}",
            f"steps={steps}",
            f"log_every={steps}",
            f"checkpoint_every={steps}",
        ]
    )
    marks: list[int] = []
    add = Throughput.add
    Throughput.add = lambda self, *a: (marks.append(len(caught)), add(self, *a))[1]
    if cuda:
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(cfg)
    if cuda:
        torch.cuda.set_sync_debug_mode("default")
    marks.append(len(caught))
    per_step = [b - a for a, b in zip(marks, marks[1:])]  # per_step[i]: step i + 1
    sources = sorted({f"{w.filename}:{w.lineno}" for w in caught[marks[1] : marks[-2]]})
    worst = max(per_step[1 : steps - 1], default=None)
    figures(syncs_per_step=per_step, max_in_steps_2_to_20=worst, sync_sources=sources[:20], device=device)
    print("synchronising calls per step:", per_step, "\nfrom:", *sources[:20], sep="\n  ")
    if not cuda:
        return 0 if len(per_step) == steps else 1
    return 0 if worst is not None and worst <= 1 else 1


def rr_eval(runs: str, *flags: str) -> int:
    """eigtrain-rr and eigtrain-eval: on the CPU dry run's resumed run, or on a fresh 4-step bf16 GPU run."""
    runs_dir = Path(runs)
    cpu = "--cpu" in flags
    device = "cpu" if cpu else "cuda"
    run_dir = runs_dir / "resume_cpu_fp32" if cpu else runs_dir / "rr_run"
    if not cpu:
        train(
            runs_dir,
            "device=cuda",
            *RESNET,
            "engine.precision=bf16",
            "steps=4",
            "checkpoint_every=4",
            f"run_dir={run_dir}",
        )
    for module in ("eigtrain.export.command",) + (() if cpu else ("eigtrain.evaluate.command",)):
        out = run_dir / module.split(".")[1]
        cmd = [sys.executable, "-m", module, f"run_dir={run_dir}", f"device={device}", f"out={out}"]
        cmd += ["num_workers=0"] if cpu else []
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    figures(run_dir=str(run_dir), outputs=sorted(p.name for p in run_dir.glob("*/*") if p.is_file())[:30])
    return 0


def nccl_syncbn() -> int:
    """Under torchrun, 1 rank: LOCAL_RANK device binding, an NCCL group, SyncBatchNorm's kernels against BatchNorm,
    and a DDP-wrapped, SyncBatchNorm-converted ResNet-18 training a few bf16 steps."""
    import copy

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from eigtrain.dist import resolve_env, select_device
    from eigtrain.models import build_encoder, convert_sync_batch_norm
    from eigtrain.schema import train_config
    from eigtrain.train.command import compose_config

    env = resolve_env()
    device = select_device(env, "cuda")
    dist.init_process_group("nccl", rank=env.rank, world_size=env.world_size, device_id=device)
    found: dict = {"device": str(device), "world_size": env.world_size, "backend": dist.get_backend()}
    ones = torch.ones(4, device=device)
    dist.all_reduce(ones)
    found["all_reduce_ok"] = bool((ones == env.world_size).all())

    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8).to(device)
    sbn = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(bn))
    x = torch.randn(16, 8, 10, 10, device=device, requires_grad=True)
    y_ref = bn(x)
    (g_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    try:  # the synchronised kernels themselves (nn.SyncBatchNorm skips them when the group has one rank)
        from torch.nn.modules._functions import SyncBatchNorm as SyncBatchNormFn

        x2 = x.detach().clone().requires_grad_(True)
        y = SyncBatchNormFn.apply(
            x2,
            sbn.weight,
            sbn.bias,
            sbn.running_mean,
            sbn.running_var,
            sbn.eps,
            sbn.momentum,
            dist.group.WORLD,
            env.world_size,
        )
        (g,) = torch.autograd.grad(y.square().sum(), x2)
        found["syncbn_kernels_max_abs_diff"] = [float((y - y_ref).abs().max()), float((g - g_ref).abs().max())]
        found["syncbn_kernels_ok"] = bool(torch.allclose(y, y_ref, atol=1e-4) and torch.allclose(g, g_ref, atol=1e-3))
    except TypeError as e:  # private API changed: say so, do not fail the step on it
        found["syncbn_kernels_ok"] = f"not run: {e}"

    cfg = train_config(compose_config(["experiment=cpu_debug", *RESNET]))
    model = convert_sync_batch_norm(build_encoder(cfg.model, cfg.dim, (3, 32, 32))).to(device)
    found["sync_batch_norm_layers"] = sum(isinstance(m, nn.SyncBatchNorm) for m in model.modules())
    ddp = DistributedDataParallel(model.to(memory_format=torch.channels_last), device_ids=[device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    step_losses = []
    for _ in range(3):
        images = torch.randn(64, 3, 32, 32, device=device).to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(images).float().square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step_losses.append(float(loss))
    found["ddp_losses"] = step_losses
    found["parameters_changed"] = any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    dist.destroy_process_group()
    figures(**found)
    print(json.dumps(found, indent=1))
    ok = (
        found["all_reduce_ok"]
        and found["syncbn_kernels_ok"] is not False
        and found["parameters_changed"]
        and all(map(math.isfinite, step_losses))
        and found["sync_batch_norm_layers"] > 0
    )
    return 0 if ok else 1


IMPLS = {"resume": resume, "host_syncs": host_syncs, "rr_eval": rr_eval, "nccl_syncbn": nccl_syncbn}


def run_impl(argv: list[str]) -> int:
    name, *rest = argv
    if name not in IMPLS:
        print(f"gpu_check: unknown step body {name!r}; known: {', '.join(IMPLS)}")
        return 2
    return IMPLS[name](*rest)
