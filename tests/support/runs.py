"""Helpers of the trainer's end-to-end tests: the CLI overrides of a tiny run, a subprocess in a clean environment,
torchrun on 2 CPU processes, and comparisons of two runs (no tests here; the digits_root fixture is in conftest)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from eigtrain.train.metrics_log import read_metrics

REPO = Path(__file__).resolve().parents[2]
# The program of a subprocess that kills itself at a chosen step or checkpoint (see its docstring)
KILL_WRAPPER = str(Path(__file__).with_name("kill_wrapper.py"))


def overrides(run_dir, digits_root, *extra):
    return [
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.root={digits_root}",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "steps=6",
        "log_every=1",
        "checkpoint_every=2",
        "keep_last=10",
        *extra,
    ]


def clean_env(**extra):
    """This environment without launcher variables (the test may itself run under Slurm or torchrun)."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in launcher}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def start_trainer(args, tmp_path, stdout=subprocess.PIPE) -> subprocess.Popen:
    """eigtrain-train with `args` as a subprocess in its own process group (a test signals it, or its whole group,
    as a terminal, a scheduler or the OOM killer would); stderr piped, as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "eigtrain.train.command", *args],
        cwd=tmp_path,
        env=clean_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_cli(args, tmp_path, timeout=300):
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=timeout
    )


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in read_metrics(run_dir)]


def assert_same_final_weights(run_a, run_b):
    a, b = load_file(str(Path(run_a) / "model.safetensors")), load_file(str(Path(run_b) / "model.safetensors"))
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ (not bit-identical): {different[:5]}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (a rendezvous port, or one to find closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(tmp_path, target, *args, timeout=300):
    """`target` (a module or script and its arguments) on 2 CPU processes under torchrun."""
    port = free_port()
    launcher = [
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        *target,
    ]
    return run_cli([*launcher, *args], tmp_path, timeout=timeout)


def check(result):
    assert result.returncode == 0, result.stderr[-3000:]
