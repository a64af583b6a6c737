"""The GPU day-one kit's steps, time boxes and report (run through tools/gpu_check.sh; standard library only).

Each step runs in its own process under its time box (the whole set <= 20 minutes), logs to OUT_DIR/logs/NAME.log,
may leave figures in OUT_DIR/logs/NAME.json, and is recorded PASS / FAIL / TIMEOUT in OUT_DIR/report.json and
OUT_DIR/REPORT.md (device, versions, figures, targets, what only a multi-GPU machine can show). The report is
rewritten after every step, merges earlier parts (--part 2 after --part 1 keeps part 1's results) and the exit
status is 0 even when a step fails: the report says which. Steps in parts of <= 10 minutes (one command each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
T0 = time.monotonic()  # the deadline counts from the start of this process (the offline install included)
TOTAL_BOX_S = 20 * 60
PART_BOX_S = 10 * 60 - 30  # the GPU machine runs one command for at most 10 minutes; 30 s for the rest
INSTALL_BOX_S = 60  # pip from local wheels + the import check, on the GPU machine
CPU_INSTALL_BOX_S = 300
QUIET = ["logging.wandb.mode=disabled", "logging.progress=false"]
RESNET = ["model=resnet18", "model.cifar_stem=true", "model.projector_hidden=512"]
TARGETS = {"memory_vs_reference": 0.90, "shards_vs_reference": 0.85, "resnet50_224_views_per_s": 5500.0}
MULTI_GPU_ONLY = [
    "NCCL collectives between GPUs (all-reduce, all-gather bandwidth and correctness across devices, NVLink/PCIe)",
    "SyncBatchNorm statistics across ranks (world size 1 runs its kernels but sums one rank's statistics)",
    "DDP gradient bucketing/overlap with real communication; the exact accumulated gradient across ranks",
    "DeepSpeed ZeRO-2/3 partitioning across ranks (one rank holds every shard)",
    "device binding of LOCAL_RANK > 0 and Slurm --gpus-per-task / several tasks per node",
    "per-device CUDA RNG streams differing across ranks; data sharding across ranks on GPUs",
    "scaling efficiency (images/s per GPU at 2..N GPUs) and the objective's communication cost at scale",
]


@dataclass
class Step:
    name: str
    part: int
    box_s: int
    what: str
    argv: list[str]
    torchrun: bool = False
    budget_margin_s: int | None = None  # bench steps: --budget-s = the step's (clipped) box minus this


# part 3 in all, install included: with ~30 s of device start-up and a killed step's 10 s, <= 8 min
THROUGHPUT_DEADLINE_S = 430


def throughput_steps(py: str, logs: Path) -> list[Step]:
    """Part 3 (issue 37): the throughput benchmark in one <= 8-minute command, most informative first. Each bench
    step starts no measurement it cannot finish (--budget-s from its box, clipped to what is left of the deadline)."""
    bench = [py, str(REPO / "tools" / "bench_gpu.py")]
    plan = [
        ("p_r18_auto", 90, "resnet18:32:512", "synthetic,reference", "auto",
         "ResNet-18 32 px b512 compiled in the shipped default mode (engine.compile_mode=auto: CUDA graphs for small "
         "views; the reference in the same mode)"),
        ("p_r50_auto", 260, "resnet50:224:256", "synthetic,reference", "auto",
         "ResNet-50 224 px b256 compiled in the shipped default mode (engine.compile_mode=auto: the plain mode at 224 "
         "px; the reference in the same mode)"),
        ("p_r18_eager", 120, "resnet18:32:512", "presets,synthetic,reference,png,jpeg", False,
         "ResNet-18 32 px b512 eager: host syncs of every preset; in memory, bare reference, PNG, JPEG shards (decode=auto: workers)"),
        ("p_r50_eager", 230, "resnet50:224:256", "presets,synthetic,reference,png,jpeg", False,
         "ResNet-50 224 px b256 eager: imagenet preset compiled; in memory, bare reference, PNG, JPEG shards (nvJPEG)"),
        ("p_r50_compiled", 260, "resnet50:224:256", "synthetic,reference", "default",
         "ResNet-50 224 px b256 compiled (trainer and reference): the 5,500 views/s target"),
        ("p_r18_compiled", 90, "resnet18:32:512", "synthetic,reference", "default",
         "ResNet-18 32 px b512 compiled (trainer and reference)"),
        ("p_r18_cudagraphs", 90, "resnet18:32:512", "synthetic,reference", "reduce-overhead",
         "ResNet-18 32 px b512 compiled with CUDA graphs (engine.compile_mode=reduce-overhead; the reference too)"),
        ("p_r50_cudagraphs", 300, "resnet50:224:256", "synthetic,reference", "reduce-overhead",
         "ResNet-50 224 px b256 compiled with CUDA graphs (engine.compile_mode=reduce-overhead; the reference too)"),
        ("p_r50_components", 260, "resnet50:224:256", "components,synthetic,reference", "default",
         "ResNet-50 224 px b256 compiled: the augmentation alone and the step on views made once, beside the step"),
        ("p_r50_augment", 270, "resnet50:224:256", "augment_forms,synthetic,reference", "default",
         "ResNet-50 224 px b256 compiled: the augmentation's reference and fusable forms side by side with their top "
         "kernels, then the step and the bare model"),
        ("p_r18_cg_shards", 150, "resnet18:32:512", "synthetic,reference,png,jpeg", "reduce-overhead",
         "ResNet-18 32 px b512 with CUDA graphs: in memory, bare reference, PNG and JPEG shards (new augmentation)"),
        ("p_r50_compiled_shards", 300, "resnet50:224:256", "synthetic,reference,png,jpeg", "default",
         "ResNet-50 224 px b256 compiled: in memory, bare reference, PNG and JPEG shards (new augmentation)"),
        ("p_r18_cg_loader", 110, "resnet18:32:512", "reference,png,jpeg", "reduce-overhead",
         "ResNet-18 32 px b512 with CUDA graphs: PNG and JPEG shards (tar headers read directly) beside the bare model"),
        ("p_r50_jpeg_ahead", 300, "resnet50:224:256", "reference,jpeg,jpeg_workers", "default",
         "ResNet-50 224 px b256 compiled: JPEG shards decoded by nvJPEG on the decode-ahead thread, then in the loader "
         "workers (decode=cpu), beside the bare model"),
    ]  # fmt: skip
    return [
        Step(
            name,
            3,
            box,
            what,
            [*bench, "--cases", cases, "--modes", modes, *(["--compile"] if compiled else [])]
            + (["--compile-mode", compiled] if compiled else [])
            + ["--out", str(logs / f"{name}.json")],
            budget_margin_s=45 if "r50" in name else 25,
        )
        for name, box, cases, modes, compiled, what in plan
    ]


FASHION_BOX_S = 8 * 60  # issue 50: each Fashion-MNIST step fits one <= 8-minute command (--part 4 --steps NAME)


def fashion_steps(py: str, logs: Path) -> list[Step]:
    """Part 4 (issue 50): the paper's protocol on Fashion-MNIST at d = 512, >= 100 epochs a step: SCL's and VICReg's
    table (tools/bench_fashion_mnist.py, report layout, seed 0) and lightly's SimCLR on the same backbone, batch and
    steps. Each writes benchmarks/fashion_mnist_gpu_<name>.md/.json (the shards: tools/fashion_mnist_data.py first)."""
    bench = [py, str(REPO / "tools" / "bench_fashion_mnist.py"), "--seeds", "0"]
    plan = [
        ("q_fashion_scl", ["--cells", "fashion_mnist_gpu_scl", "--peers"], "SCL, ResNet-18, d = 512, 100 epochs"),
        ("q_fashion_vicreg", ["--cells", "fashion_mnist_gpu_vicreg", "--peers"], "VICReg (paper), same protocol"),
        ("q_fashion_lightly", ["--cells", "fashion_mnist_gpu_scl", "--peers", "simclr", "--no-eigtrain"],
         "lightly SimCLR on the SCL recipe's backbone, batch and steps"),
    ]  # fmt: skip
    return [
        Step(
            name,
            4,
            FASHION_BOX_S,
            what,
            [*bench, *args, "--out", str(REPO / "benchmarks" / f"fashion_mnist_gpu_{name[10:]}")],
        )
        for name, args, what in plan
    ]


def cuda_steps(py: str, runs: Path, logs: Path) -> list[Step]:
    me = [py, str(REPO / "tools" / "gpu_check.py")]
    bench = [py, str(REPO / "tools" / "bench_gpu.py")]
    train = [
        py,
        "-m",
        "eigtrain.train.command",
        "experiment=cpu_debug",
        *QUIET,
        f"data.root={runs}/digits",
        "log_every=1",
    ]
    run1 = [
        py,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "eigtrain.train.command",
        "experiment=cpu_debug",
        *QUIET,
        f"data.root={runs}/digits",
        "log_every=1",
        "device=cuda",
    ]
    return [
        Step(
            "a_train_bf16_channels_last_compile_digits",
            1,
            135,
            "trainer on digits: ResNet-18, bf16 autocast, channels_last, torch.compile, 6 steps",
            [
                *train,
                "device=cuda",
                *RESNET,
                "engine.precision=bf16",
                "engine.channels_last=true",
                "engine.compile=true",
                "steps=6",
                f"run_dir={runs}/bf16",
            ],
        ),
        Step(
            "a_train_compile_synthetic",
            1,
            75,
            "trainer's step on synthetic tensors: ResNet-18 32 px batch 512, bf16 + channels_last + compile",
            [
                *bench,
                "--cases",
                "resnet18:32:512",
                "--modes",
                "synthetic",
                "--compile",
                "--steps",
                "20",
                "--repeats",
                "1",
                "--warmup",
                "5",
                "--out",
                str(logs / "a_train_compile_synthetic.json"),
            ],
        ),
        Step(
            "b_bench_gpu",
            1,
            270,
            "bench_gpu.py (quick: 30 steps, 1 repeat; part 3 is the full benchmark): ResNet-18 32 px b512, ResNet-50 224 px b256; in memory, JPEG "
            "shards (nvJPEG + GPU augmentation), PNG shards, DDP wrapper vs bare, bare torchvision reference, MFU",
            [*bench, "--steps", "30", "--repeats", "1", "--budget-s", "240", "--out", str(logs / "b_bench_gpu.json")],
        ),
        Step(
            "c_host_syncs_per_step",
            2,
            75,
            "CUDA sync-debug mode: host syncs per step, cifar preset (hue jitter), image_fit=whole, PNG shards",
            [*me, "--impl", "host_syncs", str(runs)],
        ),
        Step(
            "d_stop_resume_fp32_bitwise",
            2,
            75,
            "stop after 2 steps, resume to 4 with engine.deterministic=true: fp32 losses bit-identical",
            [*me, "--impl", "resume", str(runs), "cuda", "fp32", "0", "engine.deterministic=true"],
        ),
        Step(
            "d_stop_resume_bf16",
            2,
            75,
            "stop after 2 steps, resume to 4: bf16 losses within 2e-2",
            [*me, "--impl", "resume", str(runs), "cuda", "bf16", "2e-2"],
        ),
        Step(
            "e_deepspeed_zero2",
            2,
            70,
            "DeepSpeed ZeRO-2, one GPU rank under torchrun (NCCL group)",
            [*run1, "engine=deepspeed", "engine.zero_stage=2", "steps=6", f"run_dir={runs}/zero2"],
        ),
        Step(
            "e_deepspeed_zero3",
            2,
            70,
            "DeepSpeed ZeRO-3, one GPU rank under torchrun (NCCL group)",
            [*run1, "engine=deepspeed", "engine.zero_stage=3", "steps=6", f"run_dir={runs}/zero3"],
        ),
        Step(
            "f_rr_and_eval",
            2,
            70,
            "a 4-step bf16 ResNet-18 run, then eigtrain-rr and eigtrain-eval on the GPU",
            [*me, "--impl", "rr_eval", str(runs)],
        ),
        Step(
            "g_nccl_ddp_syncbn_1rank",
            2,
            50,
            "torchrun 1 rank: NCCL group, LOCAL_RANK binding, SyncBatchNorm "
            "converted + its kernels vs BatchNorm, DDP-wrapped ResNet-18 steps",
            [
                py,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "1",
                str(REPO / "tools" / "gpu_check.py"),
                "--impl",
                "nccl_syncbn",
            ],
        ),
    ]


def cpu_steps(py: str, runs: Path, logs: Path) -> list[Step]:
    me = [py, str(REPO / "tools" / "gpu_check.py")]
    return [
        Step(
            "cpu_stop_resume_bitwise",
            0,
            300,
            "stop + resume on the CPU, bit for bit (exact accumulation)",
            [*me, "--impl", "resume", str(runs), "cpu", "fp32", "0"],
        ),
        Step("cpu_rr", 0, 300, "eigtrain-rr on the resumed run", [*me, "--impl", "rr_eval", str(runs), "--cpu"]),
        Step(
            "cpu_host_syncs_plumbing",
            0,
            300,
            "step (c)'s run on the CPU: PNG shards, cifar preset, image_fit=whole",
            [*me, "--impl", "host_syncs", str(runs), "cpu"],
        ),
        Step(
            "cpu_bench_dry_run",
            0,
            300,
            "bench_gpu.py --dry-run (every mode, tiny, CPU)",
            [py, str(REPO / "tools" / "bench_gpu.py"), "--dry-run", "--out", str(logs / "cpu_bench_dry_run.json")],
        ),
    ]


# ----------------------------------------------------------------------------------------------------------------
# Orchestration


COMPONENT_ROWS = ("augment_only", "step_on_made_views")  # bench_gpu.COMPONENTS: parts of the step, no targets


def probe(py: str, env: dict, code: str, timeout: float = 120) -> str:
    try:
        done = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


VERSIONS = """
import importlib.metadata as m, json, platform, torch
v = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
     "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
     "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
     "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0}
for d in ("torchvision", "timm", "numpy", "deepspeed", "hydra-core", "kornia", "webdataset", "eigtrain"):
    try: v[d] = m.version(d)
    except m.PackageNotFoundError: v[d] = None
print(json.dumps(v))
"""


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:  # already gone
        pass


def run_step(step: Step, env: dict, logs: Path, cwd: Path) -> dict:
    log = logs / f"{step.name}.log"
    t0 = time.monotonic()
    with open(log, "w") as out:
        out.write(f"$ {' '.join(step.argv)}\n")
        out.flush()
        # cwd: not the repository, whose eigtrain/ (without its configs) would shadow the installed package
        proc = subprocess.Popen(
            step.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            env={**env, "GPU_CHECK_FIGURES": str(logs / f"{step.name}.json")},
        )
        try:
            code = proc.wait(timeout=step.box_s)
            status = "PASS" if code == 0 else "FAIL"
        except subprocess.TimeoutExpired:
            kill_group(proc, 15)  # the step's own process group (torchrun's children included)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(proc, 9)
                proc.wait()
            status = "TIMEOUT"
    result = {
        "status": status,
        "seconds": round(time.monotonic() - t0, 1),
        "box_s": step.box_s,
        "part": step.part,
        "what": step.what,
        "log": str(log),
    }
    figures = logs / f"{step.name}.json"
    if figures.exists():
        try:
            result["figures"] = json.loads(figures.read_text())
        except ValueError:
            result["figures"] = {"error": f"{figures} is not JSON"}
    if status != "PASS":
        result["tail"] = log.read_text(errors="replace").splitlines()[-12:]
    return result


def clipped(step: Step, left: float | None) -> Step:
    """The step with its box clipped to the time left, and a bench step's --budget-s from that box."""
    box = step.box_s if left is None else int(min(step.box_s, left - 5))
    argv = step.argv
    if step.budget_margin_s is not None:
        argv = [*argv, "--budget-s", str(max(1, box - step.budget_margin_s))]
    return Step(step.name, step.part, box, step.what, argv, step.torchrun, step.budget_margin_s)


def list_steps(steps: list[Step], install_box: int) -> None:
    parts = sorted({s.part for s in steps})
    total = install_box * len(parts) + sum(s.box_s for s in steps)
    print(f"gpu_check: {len(steps)} steps (+ the offline install in each part), time boxes:")
    for part in parts:
        print(f"  part {part}: install from .whl/ ({install_box} s)" if part else f"  install ({install_box} s)")
        for s in (s for s in steps if s.part == part):
            print(f"    {s.name:<44} {s.box_s:>4} s  {s.what}")
        box = install_box + sum(s.box_s for s in steps if s.part == part)
        print(f"    part {part} in all: {box} s" if part else f"    in all: {box} s")
        if part == 3:
            print(
                f"    (on the GPU clipped to a {THROUGHPUT_DEADLINE_S} s deadline: later steps run while time is left)"
            )
    print(f"  total time boxes: {total} s ({total / 60:.1f} min; limit {TOTAL_BOX_S // 60} min)")


def fmt(x, digits=0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}" if isinstance(x, (int, float)) else str(x)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


def bench_lines(figures: dict) -> list[str]:
    """The benchmark's table (median views/s over repeats, their range and spread) and the issue's targets."""
    lines = [
        "| model | px | batch | compiled | mode | views/s | range | spread | pairs/s | MFU | host syncs/step "
        "| vs same-mode bare |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    device = figures.get("device", "?")
    first = (figures.get("results") or [{}])[0]
    targets = [
        f"- device {device} (driver: {figures.get('device_driver_name', '-')}, {figures.get('driver', '-')}); "
        f"timer: {figures.get('timer', '-')}; {first.get('steps')} steps x {first.get('repeats')} repeats after "
        f"{first.get('warmup')} warm-up steps; views/s = 2 x pairs/s; range: slowest-fastest repeat"
    ]
    for case in figures.get("results", []):
        mode_name = case.get("compile_mode") or "default"
        if case.get("compile_mode_setting") == "auto":  # the shipped default, resolved by the step's shape
            mode_name = f"auto: {mode_name}"
        compiled = ("yes" if mode_name == "default" else mode_name) if case.get("compile") else "no"
        modes, ref = case.get("modes", {}), case.get("modes", {}).get("reference", {}).get("views_per_s")
        label = ("compiled" if mode_name == "default" else f"compiled {mode_name}") if case.get("compile") else "eager"
        where = f"{case['model']}@{case['image_size']} {label}"
        for mode, m in modes.items():
            vps = m.get("views_per_s")
            if vps is None:
                continue
            low, high = m.get("views_per_s_range", [None, None])
            mfu = f"{m['mfu']:.1%}" if m.get("mfu") is not None else "-"
            lines.append(
                f"| {case['model']} | {case['image_size']} | {case['batch']} | {compiled} | {mode} | {fmt(vps)} "
                f"| {fmt(low)}-{fmt(high)} | {_pct(m.get('spread'))} | {fmt(m.get('pairs_per_s'))} | {mfu} "
                f"| {fmt(m.get('host_syncs_per_step'), 1)} | {_pct(vps / ref) if ref and mode != 'reference' else '-'} |"
            )
            if ref and mode != "reference" and mode not in COMPONENT_ROWS:
                goal = (
                    TARGETS["memory_vs_reference"] if mode in ("synthetic", "ddp") else TARGETS["shards_vs_reference"]
                )
                met = "MET" if vps / ref >= goal else "NOT MET"
                decoded = f" (decoded: {m['decoded_in']})" if m.get("decoded_in") else ""
                targets.append(
                    f"- target {where} {mode}{decoded} >= {goal:.0%} of the bare model: {vps / ref:.0%} {met}"
                )
        if case["model"] == "resnet50" and case["image_size"] == 224 and case.get("compile"):
            steps = {k: m for k, m in modes.items() if k != "reference" and k not in COMPONENT_ROWS}
            best = max((m.get("views_per_s") or 0 for m in steps.values()), default=0)
            met = "MET" if best >= TARGETS["resnet50_224_views_per_s"] else "NOT MET"
            targets.append(
                f"- target ResNet-50 224 px bf16 compiled >= 5,500 views/s per H100: {fmt(best)} on {device} {met}"
            )
        for preset, p in modes.get("presets", {}).get("presets", {}).items():
            source = f" (from {', '.join(p['from'])})" if p.get("from") else ""
            line = f"- {preset} augmentation alone (both views): host syncs per call {fmt(p.get('host_syncs_per_call'), 1)}"
            line += f"{source}; GPU ops per call {fmt(p.get('gpu_ops_per_call_eager'))} eager"
            if "compile_s" in p:
                line += (
                    f", {fmt(p.get('gpu_ops_per_call_compiled'))} compiled ({'compiled' if p.get('compiled') else 'FELL BACK to eager'}"
                    f" in {fmt(p.get('compile_s'), 1)} s; host syncs {fmt(p.get('host_syncs_per_call_compiled'), 1)}; "
                    f"max |compiled - eager| {fmt(p.get('max_abs_compiled_minus_eager'), 4)})"
                )
            targets.append(line)
        targets += augment_form_lines(modes.get("augment_forms", {}))
    lines += ["", *targets]
    for case in figures.get("results", []):
        errors = [("", case["error"])] if case.get("error") else []
        errors += [(f" {mode}", m["error"]) for mode, m in case.get("modes", {}).items() if m.get("error")]
        lines += [f"- FAILED {case['model']}@{case['image_size']}{where}: {error}" for where, error in errors]
    for name in figures.get("skipped", []):
        lines.append(f"- not measured (time budget): {name}")
    return lines


def augment_form_lines(forms: dict) -> list[str]:
    """bench_gpu's augment_forms mode: each form's time per call (both views) and its top kernels."""
    if "speedup" not in forms:
        return []
    lines = [
        f"- augmentation alone, both views ({'compiled' if forms.get('compiled') else 'eager'}): reference form "
        f"{fmt(forms['reference']['seconds_per_step'] * 1e3, 2)} ms, fusable form "
        f"{fmt(forms['fusable']['seconds_per_step'] * 1e3, 2)} ms per call ({forms['speedup']:.2f}x; first calls "
        f"{fmt(forms['reference'].get('first_call_s'), 1)} s and {fmt(forms['fusable'].get('first_call_s'), 1)} s; "
        f"max |fusable - reference| {fmt(forms.get('max_abs_fusable_minus_reference'), 4)})"
    ]
    for form in ("reference", "fusable"):
        kernels = forms[form].get("kernels", {})
        top = "; ".join(
            f"{k['name'][:60]} {k['us_per_call']:,.0f} us x{k['count']}" for k in kernels.get("top", [])[:5]
        )
        lines.append(
            f"  - {form}: {fmt(kernels.get('ops_per_call'))} {kernels.get('what', 'ops')} per call, "
            f"{fmt(kernels.get('total_us_per_call'))} us in all; top: {top}{kernels.get('error', '')}"
        )
    return lines


def checkout_commit(repo: Path) -> str:
    """The commit whose files this checkout holds. HEAD alone can mislead: a machine that gets the working tree with
    an old .git copy (the GPU machine's sync) reports that copy's HEAD. So the tree of the files as they are (tracked
    and untracked, the ignored ones left out) is hashed through a throwaway index into a throwaway object folder
    (nothing is written into .git) and compared with HEAD's tree; when they differ, the report names the tree,
    which `git log --all --format='%h %T'` maps to its commit here."""

    def git(*args: str, **env: str) -> str | None:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **env}
        )
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    objects = git("rev-parse", "--path-format=absolute", "--git-path", "objects")
    tree = None
    if objects:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "objects").mkdir()
            scratch = {
                "GIT_INDEX_FILE": str(Path(tmp) / "index"),
                "GIT_OBJECT_DIRECTORY": str(Path(tmp) / "objects"),
                "GIT_ALTERNATE_OBJECT_DIRECTORIES": objects,
            }
            if git("add", "-A", ".", **scratch) is not None:
                tree = git("write-tree", **scratch)
    if not head and not tree:
        return "unknown (no .git)"
    if tree and tree == git("rev-parse", "HEAD^{tree}"):
        return head
    if not tree:
        return f"{head} (the files' own tree unknown)"
    where = f"not {head}'s: uncommitted changes, or a copy whose .git is stale" if head else "no commit"
    return (
        f"the files of tree {tree[:12]} ({where}; `git log --all --format='%h %T' | grep {tree[:12]}` names its commit)"
    )


def write_report(out: Path, report: dict) -> None:
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for path in (out / "report.json", out / "logs" / "report_state.json"):
        path.write_text(json.dumps(report, indent=1))
    v = report.get("versions", {})
    lines = [
        "# GPU check report (tools/gpu_check.sh)",
        "",
        f"- device: {v.get('device')} ({v.get('gpus')} visible); written {report.get('written')}",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k not in ("device", "gpus")),
        f"- commit: {report.get('commit')}",
        "",
        "| step | part | result | seconds | box s |",
        "|---|---|---|---|---|",
    ]
    steps = report.get("steps", {})
    for name, r in steps.items():
        lines.append(f"| {name} | {r.get('part')} | {r['status']} | {r['seconds']} | {r['box_s']} |")
    lines.append("")
    for name, r in steps.items():
        lines += [f"## {name}: {r['status']}", "", r.get("what", ""), ""]
        figures = r.get("figures")
        if figures and "results" in figures:
            lines += bench_lines(figures)
        elif figures:
            lines += [f"- {k}: {json.dumps(val)}" for k, val in figures.items()]
        if r.get("tail"):
            lines += ["", "```", *r["tail"], "```"]
        lines.append("")
    install = report.get("install")
    if install:
        lines += ["## Offline install", ""]
        lines += [f"- {n} {p['version']} from {p['from']}" for n, p in sorted(install.get("packages", {}).items())]
        lines += [f"- unmet: {u}" for u in install.get("unmet", [])] + [""]
    lines += ["## What only a multi-GPU machine can show", ""] + [f"- {x}" for x in MULTI_GPU_ONLY] + [""]
    (out / "REPORT.md").write_text("\n".join(lines))


def copy_report(out: Path, dest: Path | None) -> None:
    if dest is None:
        return
    (dest / "logs").mkdir(parents=True, exist_ok=True)
    for path in [out / n for n in ("REPORT.md", "report.json", "summary.txt")] + sorted((out / "logs").glob("*")):
        if path.is_file():
            shutil.copy2(path, dest / path.relative_to(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list the steps with their time boxes, then the CPU dry run of the plumbing (never the GPU)",
    )
    parser.add_argument(
        "--part",
        type=int,
        choices=(1, 2, 3, 4),
        default=None,
        help="only this part (1, 2: <= 10 min each; 3: the throughput benchmark, <= 8 min; 4: Fashion-MNIST at "
        "d = 512, one <= 8-minute step a command: --steps q_fashion_scl)",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help=f"stop starting steps after this many seconds, boxes clipped to it (part 3: {THROUGHPUT_DEADLINE_S})",
    )
    parser.add_argument("--steps", default=None, help="only these steps (comma separated names)")
    parser.add_argument(
        "--copy-to",
        type=Path,
        default=None,
        help="after every step, copy the report and the logs "
        "here too (e.g. the folder a remote run sends back); runs and installs stay in OUT_DIR",
    )
    parser.add_argument("--impl", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.impl:
        from gpu_check_steps import run_impl  # the step bodies (need torch + eigtrain)

        return run_impl(args.impl)

    py = sys.executable
    commit = checkout_commit(REPO)  # before any step rewrites the (tracked) report
    wheels = Path(os.environ.get("WHEELS") or REPO / ".whl")
    out = Path(
        os.environ.get("OUT_DIR")
        or (tempfile.mkdtemp(prefix="gpu_check_") if args.dry_run else REPO / "benchmarks" / "gpu")
    )
    logs, runs = out / "logs", Path(os.environ.get("RUNS_DIR") or out / "runs")
    site = Path(os.environ.get("SITE_DIR") or out / "site")
    for d in (logs, runs):
        d.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }
    env.pop("PYTHONPATH", None)
    gpus = int(
        probe(py, env, "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)") or 0
    )
    install_box = INSTALL_BOX_S if gpus else CPU_INSTALL_BOX_S  # a loaded CI machine imports slowly
    if wheels.is_dir():
        install = Step(
            "install",
            0,
            install_box,
            f"offline install from {wheels}",
            [
                py,
                str(REPO / "tools" / "offline_install.py"),
                "--wheels",
                str(wheels),
                "--target",
                str(site),
                "--tree",
                str(REPO),
                "--json",
                str(logs / "install_plan.json"),
            ],
        )
        print(f"gpu_check: installing from {wheels} into {site} (no index, no deps; torch stays the image's)")
        done = run_step(install, env, logs, runs)
        print((logs / "install.log").read_text(errors="replace"), end="")
        env["PYTHONPATH"] = str(site)
    else:
        done = {"status": "PASS", "seconds": 0, "box_s": 0, "part": 0, "what": f"no {wheels}: this Python's packages"}
        print(f"gpu_check: no {wheels}: using {py}'s own packages (run tools/device_wheels.sh for an offline machine)")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(REPO / "tools")]))
    versions = json.loads(probe(py, env, VERSIONS) or "{}")
    steps = (
        {3: throughput_steps, 4: fashion_steps}[args.part](py, logs)
        if args.part in (3, 4)
        else cuda_steps(py, runs, logs)
    )
    if args.dry_run or not gpus:
        list_steps(steps, INSTALL_BOX_S)
    if not gpus or args.dry_run:
        print(
            "gpu_check: no CUDA device visible: the GPU steps need one (nothing measured)."
            if not gpus
            else "gpu_check: --dry-run: the GPU steps are listed, not run."
        )
        steps = cpu_steps(py, runs, logs)
        print(f"gpu_check: CPU dry run of the same plumbing (logs in {logs})")
    if args.part in (1, 2):
        steps = [s for s in steps if s.part in (0, args.part)]
    deadline = args.deadline_s or (THROUGHPUT_DEADLINE_S if args.part == 3 and gpus and not args.dry_run else None)
    if args.steps:
        steps = [s for s in steps if s.name in args.steps.split(",")]
    # merge with an earlier part: its state in logs/ (git-ignored, so it stays on a machine whose tree is re-synced
    # between commands), else a report.json put back in OUT_DIR
    previous = next((p for p in (logs / "report_state.json", out / "report.json") if p.exists()), None)
    merge = previous and not args.dry_run and gpus and args.part != 3  # part 3 (the benchmark alone) starts afresh
    report = json.loads(previous.read_text()) if merge else {"steps": {}}
    report.update(
        versions=versions,
        commit=commit,
        written=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        platform=platform.platform(),
    )
    report["steps"]["install"] = done
    if (logs / "install_plan.json").exists():
        report["install"] = json.loads((logs / "install_plan.json").read_text())
    print(f"{done['status']} install ({done['seconds']} s)")
    # a partial install may still be enough (say, one optional package failed its import): go on if eigtrain imports
    usable = done["status"] == "PASS" or probe(py, env, "import eigtrain.train.command; print('ok')") == "ok"
    for step in steps:
        left = None if deadline is None else deadline - (time.monotonic() - T0)
        if left is not None and left < 30:
            report["steps"][step.name] = {
                "status": "SKIPPED",
                "seconds": 0,
                "box_s": step.box_s,
                "part": step.part,
                "what": step.what + f" (the {deadline:.0f} s deadline: {max(left, 0):.0f} s left)",
            }
        elif not usable:
            report["steps"][step.name] = {
                "status": "SKIPPED",
                "seconds": 0,
                "box_s": step.box_s,
                "part": step.part,
                "what": step.what + " (the offline install failed)",
            }
        else:
            step = clipped(step, left)
            report["steps"][step.name] = result = run_step(step, env, logs, runs)
            print(f"{result['status']} {step.name} ({result['seconds']} s of {step.box_s} s)")
            for line in result.get("tail", []):
                print(f"  [{step.name}] {line}")
        write_report(out, report)
        copy_report(out, args.copy_to)
    write_report(out, report)
    if out.resolve() != (REPO / "benchmarks" / "gpu").resolve() and gpus and not args.dry_run:
        dest = REPO / "benchmarks" / "gpu"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("REPORT.md", "report.json"):
            shutil.copy2(out / name, dest / name)
    ran = [report["steps"][s.name]["status"] for s in steps] + [done["status"]]
    ok = all(s == "PASS" for s in ran)
    (out / "summary.txt").write_text("".join(f"{report['steps'][n]['status']} {n}\n" for n in report["steps"]))
    copy_report(out, args.copy_to)
    if not gpus or args.dry_run:
        print(
            f"gpu_check: CPU dry run {'OK' if ok else 'FAILED'} (no GPU: nothing measured); report {out / 'REPORT.md'}"
        )
        return 0 if ok else 1
    print(
        f"gpu_check: {'all steps passed' if ok else 'some steps FAILED (see the report)'}; report {out / 'REPORT.md'}"
    )
    return 0  # the report says what failed; a failing step must not lose the others' figures


if __name__ == "__main__":
    sys.exit(main())
