"""Shared helpers of the trainer's end-to-end tests (no tests here)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eigtrain.data.write import main as write_shards_cli
from eigtrain.metrics_log import read_metrics

REPO = Path(__file__).resolve().parent.parent

# Runs eigtrain-train after arranging a real SIGKILL of this process (rank 0 only under torchrun):
#   python WRAPPER step N ...overrides    dies as the N-th training step of this process starts
#   python WRAPPER marker S ...overrides  dies after writing checkpoint S, before its completion marker
KILL_WRAPPER = '''
import os, signal, sys
import eigtrain.checkpoint as ckpt
from eigtrain.engine.ddp import DDPEngine
from eigtrain.engine.deepspeed_zero import DeepSpeedEngine
from eigtrain.train import main

mode, at = sys.argv.pop(1), int(sys.argv.pop(1))
if os.environ.get("RANK", "0") == "0":
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if mode == "step":
        calls = [0]
        def patch(cls):
            original = cls.train_step
            def train_step(self, *args, **kwargs):
                calls[0] += 1
                if calls[0] == at:
                    die()
                return original(self, *args, **kwargs)
            cls.train_step = train_step
        patch(DDPEngine), patch(DeepSpeedEngine)
    else:
        original_mark = ckpt.mark_complete
        def mark_complete(path, info):
            if info["step"] == at:
                die()
            original_mark(path, info)
        ckpt.mark_complete = mark_complete
main()
'''


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    write_shards_cli(["source=digits", f"out={root}", "shard_size=200"])
    return root


def overrides(run_dir, digits_root, *extra):
    return ["experiment=cpu_debug", f"run_dir={run_dir}", f"data.root={digits_root}", "logging.wandb.mode=disabled",
            "logging.progress=false", "steps=6", "log_every=1", "checkpoint_every=2", "keep_last=10", *extra]


def clean_env(**extra):
    """This environment without launcher variables (the test may itself run under Slurm or torchrun)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run_cli(args, tmp_path, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def kill_wrapper(tmp_path):
    path = tmp_path / "kill_wrapper.py"
    path.write_text(KILL_WRAPPER)
    return str(path)


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in read_metrics(run_dir)]


def assert_same_final_weights(run_a, run_b):
    a, b = load_file(str(Path(run_a) / "model.safetensors")), load_file(str(Path(run_b) / "model.safetensors"))
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"tensors differ (not bit-identical): {different[:5]}"
