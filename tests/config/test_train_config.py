"""Config checks fail fast with messages naming the key; the schedule is a pure function of the step."""

import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException

from eigtrain.engine import lr_at
from eigtrain.schema import ConfigError, SGDConfig
from eigtrain.train.checks import validate
from eigtrain.train.command import compose_config


def cfg_with(*overrides):
    return compose_config(["experiment=cpu_debug", *overrides])


@pytest.mark.parametrize(
    "overrides, world, message",
    [
        (["batch_size=60"], 8, r"batch_size=60 must be divisible by world size x micro_batch_size = 8 x 7"),
        (
            ["batch_size=64", "micro_batch_size=12"],
            2,
            r"batch_size=64 must be divisible by world size x micro_batch_size = 2 x 12",
        ),
        (["objective=rq", "batch_size=6"], 2, r"objective=rq splits each per-rank micro-batch .* must be even, got 3"),
        (["objective=lora"], 1, r"objective=lora trains two encoders on stored pairs and needs data.mode=pairs"),
        (
            ["objective=scl", "data=pairs"],
            1,
            r"objective=scl trains one encoder on two views .* use objective: lora, rq, vicreg",
        ),
        (["engine=deepspeed", "engine.zero_stage=4"], 1, r"engine.zero_stage=4 is not allowed; allowed: 1, 2, 3"),
        (["engine.precision=fp16"], 1, r"engine.precision='fp16' is not allowed; allowed: auto, fp32, bf16"),
        (["optim.schedule=step"], 1, r"optim.schedule='step' is not allowed; allowed: cosine, constant"),
        (["model.backbone=resnet7"], 1, r"model.backbone='resnet7' is not allowed; allowed: tiny_cnn, resnet18"),
        (
            ["logging.wandb.mode=cloud"],
            1,
            r"logging.wandb.mode='cloud' is not allowed; allowed: offline, online, disabled",
        ),
        (["data.augment=autoaugment"], 1, r"data.augment='autoaugment' is not allowed; allowed: .*digits"),
        (["steps=0"], 1, r"steps must be a positive integer, got 0"),
        (["stop_after=-2"], 1, r"stop_after must be a positive integer, got -2"),
        (["+stepz=5"], 1, r"unknown key 'stepz'; allowed: .*steps"),
        (["+model.widht=5"], 1, r"unknown key 'model.widht'; allowed: .*width"),
        (["model.pool=0"], 1, r"model.pool must be a positive integer, got 0"),
        (["model=resnet18", "model.pool=3"], 1, r"model.pool=3 is the tiny_cnn's pooled grid; model.backbone=resnet18"),
        (["model.cifar_stem=true"], 1, r"model.cifar_stem=true replaces a ResNet's stem .* model.backbone=tiny_cnn"),
    ],
)
def test_bad_configs_name_the_key_and_the_allowed_values(overrides, world, message):
    with pytest.raises(ConfigError, match=message):
        validate(cfg_with(*overrides), world_size=world)


def test_good_config_gives_micro_batch_and_accumulation():
    assert validate(cfg_with(), world_size=2) == (32, 1)
    assert validate(cfg_with("micro_batch_size=8"), world_size=2) == (8, 4)
    for experiment in ("cifar10_vicreg", "cifar10_scl", "imagenette_vicreg", "imagenette_scl"):
        cfg = compose_config([f"experiment={experiment}"])
        assert validate(cfg, world_size=8)
        assert (cfg.dim, cfg.nesting.mode, cfg.nesting.prefixes, cfg.model.backbone) == (
            512,
            "joint",
            "mrl",
            "resnet18",
        )
        assert (cfg.optim.name, cfg.optim.lr, cfg.optim.momentum, cfg.optim.weight_decay, cfg.optim.grad_clip) == (
            "sgd",
            0.1,
            0.9,
            5e-4,
            3.0,
        )


def test_hydra_rejects_unknown_keys_and_groups_with_the_options():
    with pytest.raises(ConfigCompositionException, match="Could not override 'stepz'"):
        cfg_with("stepz=3")
    with pytest.raises(MissingConfigException, match="Available options in 'objective'"):
        cfg_with("objective=simclr")


def _train_command(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "eigtrain.train.command", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "MASTER_"))},
    )


def test_command_line_fails_fast_on_a_bad_config(tmp_path):
    out = _train_command(
        tmp_path, "experiment=cpu_debug", f"run_dir={tmp_path / 'run'}", "batch_size=63", "micro_batch_size=2"
    )
    assert out.returncode != 0
    assert "config error: batch_size=63 must be divisible by world size x micro_batch_size = 1 x 2" in out.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # failed before any work


@pytest.mark.parametrize(
    "args, line",
    [
        (["model.widht=3"], "unknown key 'model.widht'; allowed: backbone, width, depth"),
        (["objective=simclr"], "objective=simclr is not an option; allowed: lora, rq, rq_direct, scl, vicreg"),
        (
            ["-m", "optim.lr=0.1,fast"],
            "bad value for optim.lr: Value 'fast' of type 'str' could not be converted to Float",
        ),
    ],
)
def test_a_bad_config_prints_one_line_naming_the_key(tmp_path, args, line):
    out = _train_command(
        tmp_path,
        *(args[:1] if args[0] == "-m" else []),
        "experiment=cpu_debug",
        *(args[1:] if args[0] == "-m" else args),
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"eigtrain-train: config error: {line}"), out.stderr
    assert "Traceback" not in out.stderr and "HYDRA_FULL_ERROR" not in out.stderr
    assert not any(tmp_path.iterdir())  # nothing written, nothing submitted


def test_cosine_schedule_with_warmup_is_a_function_of_the_step():
    cfg = SGDConfig(lr=0.1, warmup_steps=10, final_lr=0.0, schedule="cosine")
    assert lr_at(0, cfg, 100) == pytest.approx(0.01) and lr_at(9, cfg, 100) == pytest.approx(0.1)
    assert lr_at(10, cfg, 100) == pytest.approx(0.1)
    assert lr_at(55, cfg, 100) == pytest.approx(0.05)  # half-way through the decay
    assert lr_at(100, cfg, 100) == pytest.approx(0.0, abs=1e-12)
    lrs = [lr_at(s, cfg, 100) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lr_at(50, replace(cfg, schedule="constant"), 100) == 0.1
    assert math.isclose(lr_at(30, replace(cfg, final_lr=0.02), 100), 0.02 + 0.04 * (1 + math.cos(math.pi * 20 / 90)))
