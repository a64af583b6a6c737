"""Hydra multirun: one run directory per sweep point, named by the point's overrides."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from eigtrain.schema import TrainConfig
from eigtrain.train.sweep_naming import NOT_RESULT_KEYS, names_point, sweep_point

POINT = ["experiment=cpu_debug", "optim.lr=0.05", "seed=1"]
# Keys that change nothing trained: where and how fast it runs, what it logs, when this invocation stops.
RUN_KEYS = [
    "checkpoint_every=7",
    "log_every=3",
    "keep_last=1",
    "data.num_workers=4",
    "logging.wandb.mode=online",
    "logging.progress=false",
    "monitor.every=50",
    "stop_after=10",
    "launcher=slurm",
    "launcher.time=30",
    "run_dir=/elsewhere",
    "name=again",
    "device=cpu",
    "cpu_threads=2",
    "data.io_timeout_s=5",
    "data.prefetch_factor=4",
    "+launcher.additional_parameters.hold=true",
    "dist_timeout_s=60",
]
# Keys that change the trained result, each one a different point.
RESULT_KEYS = [
    "optim.lr=0.1",
    "seed=2",
    "steps=500",
    "batch_size=128",
    "micro_batch_size=16",
    "dim=32",
    "objective=vicreg",
    "nesting=joint",
    "model.width=64",
    "data.shuffle_block=10",
    "data.mix_shards=2",
    "data.augment=cifar",
    "engine.precision=bf16",
    "optim.weight_decay=0.01",
    "data.root=/data/other",
]


@pytest.mark.slow
def test_two_point_multirun_trains_in_two_run_directories_with_different_losses(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        "experiment=cpu_debug",
        "optim.lr=0.05,0.5",
        "steps=4",
        "checkpoint_every=2",
        "log_every=1",
        f"run_dir={sweep}",
        f"data.root={tmp_path / 'digits'}",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    out = subprocess.run(
        [sys.executable, "-m", "eigtrain.train.command", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]

    # named by the point's result-changing overrides, sorted, without where/how it runs (run_dir, logging.*,
    # checkpoint_every, log_every)
    data = f"data.root=digits-{hashlib.sha1(str(tmp_path / 'digits').encode()).hexdigest()[:8]}"
    points = {lr: sweep / f"{data},experiment=cpu_debug,optim.lr={lr},steps=4" for lr in ("0.05", "0.5")}
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


def test_a_point_is_named_by_what_it_trains_only():
    base = sweep_point(POINT)
    for extra in RUN_KEYS:  # a requeue changing any of these resumes the same directory
        assert sweep_point([extra, *POINT]) == base, extra
    assert sweep_point([*RUN_KEYS, *reversed(POINT)]) == base
    names = {sweep_point([*POINT, key]) for key in RESULT_KEYS}
    assert base not in names and len(names) == len(RESULT_KEYS)  # each result-changing key: its own point


def test_every_listed_run_key_is_a_real_config_key():
    import dataclasses

    from eigtrain.schema import DataConfig, EngineConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)} | {"hydra"}
    nested = {"data": DataConfig, "engine": EngineConfig}
    for key in NOT_RESULT_KEYS:
        group, _, sub = key.partition(".")
        assert group in fields, key
        assert not sub or sub in {f.name for f in dataclasses.fields(nested[group])}, key
    assert names_point("optim.lr") and not names_point("+logging.wandb.entity")


def test_a_point_name_carries_no_credential_and_survives_a_new_signature():
    url = "data.shards=https://user:pw@host/shards/train-{000..009}.tar?X-Amz-Signature=s3cr3t&X-Amz-Expires=60"
    name = sweep_point([*POINT, url])
    assert "s3cr3t" not in name and "pw" not in name and "train-" in name
    assert sweep_point([*POINT, url.replace("s3cr3t", "renewed")]) == name  # a re-signed URL: same point


@pytest.mark.slow
def test_a_requeue_that_changes_only_run_keys_resumes_its_point(tmp_path):
    sweep = tmp_path / "sweep"
    common = [
        "-m",
        "experiment=cpu_debug",
        "steps=4",
        f"run_dir={sweep}",
        f"data.root={tmp_path / 'digits'}",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    for extra in (
        ["stop_after=2", "checkpoint_every=2", "log_every=1"],  # the first submission stops at step 2
        ["checkpoint_every=3", "log_every=2", "data.num_workers=0", "keep_last=1"],
    ):  # the requeue
        out = subprocess.run(
            [sys.executable, "-m", "eigtrain.train.command", *common, *extra],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    (point,) = [p for p in sweep.iterdir() if p.is_dir()]
    steps = [json.loads(line)["step"] for line in (point / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 4]  # resumed after step 2 (then logged every 2 and at the end), not restarted
    assert "resumed from" in out.stderr or "resumed from" in out.stdout
