"""Hydra multirun: one run directory per sweep point, named by the point's overrides."""

import hashlib
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_two_point_multirun_trains_in_two_run_directories_with_different_losses(tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "experiment=cpu_debug", "optim.lr=0.05,0.5", "steps=4", "checkpoint_every=2", "log_every=1",
            f"run_dir={sweep}", f"data.root={tmp_path / 'digits'}", "logging.wandb.mode=disabled", "logging.progress=false"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    out = subprocess.run([sys.executable, "-m", "eigtrain.train", *args], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]

    # named by the point's overrides, sorted, without where/how it runs (run_dir, logging.*)
    data = f"data.root=digits-{hashlib.sha1(str(tmp_path / 'digits').encode()).hexdigest()[:8]}"
    points = {lr: sweep / f"checkpoint_every=2,{data},experiment=cpu_debug,log_every=1,optim.lr={lr},steps=4"
              for lr in ("0.05", "0.5")}
    assert sorted(p for p in sweep.iterdir() if p.is_dir()) == sorted(points.values())
    losses = {}
    for lr, run_dir in points.items():
        config = (run_dir / "config.yaml").read_text()
        assert f"run_dir: {run_dir}" in config and f"lr: {lr}" in config
        assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2", "step-4"]
        lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [1, 2, 3, 4]
        losses[lr] = lines[-1]["loss"]
    assert losses["0.05"] != losses["0.5"]
    assert not (tmp_path / "multirun").exists() and not (tmp_path / "runs").exists()
