"""Builders take the schema's dataclasses: every default is the schema's, written once (issue 23 item 1)."""

from pathlib import Path

import pytest
import torch

from eigtrain.engine import build_engine, build_optimizer, lr_at
from eigtrain.models import build_encoder
from eigtrain.schema import AdamWConfig, EngineConfig, ModelConfig, SGDConfig, WandbConfig, train_config, typed
from eigtrain.train.command import compose_config
from eigtrain.train.metrics_log import MetricsLog
from eigtrain.train.monitor import build_monitor

REPO = Path(__file__).resolve().parents[2]


def test_optimizers_take_their_dataclass_and_its_defaults():
    model = torch.nn.Linear(3, 2)
    sgd = build_optimizer(model, SGDConfig())
    assert sgd.defaults["momentum"] == SGDConfig.momentum and sgd.defaults["nesterov"] == SGDConfig.nesterov
    adamw = build_optimizer(model, AdamWConfig())
    assert adamw.defaults["betas"] == tuple(AdamWConfig().betas) and adamw.defaults["eps"] == AdamWConfig.eps
    # a config of some keys: the rest are the schema's (not a second copy of them in the builder)
    assert build_optimizer(model, SGDConfig(lr=0.5)).defaults["momentum"] == SGDConfig.momentum


def test_schedule_and_engine_read_typed_configs():
    optim = SGDConfig(lr=0.1, warmup_steps=10)
    assert lr_at(0, optim, 100) == pytest.approx(0.01) and lr_at(100, optim, 100) == pytest.approx(0.0, abs=1e-12)
    engine = build_engine(
        EngineConfig(), optim, torch.nn.Linear(3, 2), device=torch.device("cpu"), micro_batch_size=4, grad_accum_steps=1
    )
    assert engine.optimizer.defaults["momentum"] == SGDConfig.momentum


def test_encoder_defaults_are_the_schemas():
    encoder = build_encoder(ModelConfig(width=4), dim=6, input_shape=(1, 8, 8))
    linears = [m for m in encoder.projector if isinstance(m, torch.nn.Linear)]
    assert linears[0].out_features == ModelConfig.projector_hidden
    assert len(linears) == ModelConfig.projector_layers + 1
    partial = build_encoder(typed(ModelConfig, {"backbone": "tiny_cnn", "width": 4}), dim=6, input_shape=(1, 8, 8))
    assert [m.out_features for m in partial.projector if isinstance(m, torch.nn.Linear)] == [
        m.out_features for m in linears
    ]


def test_metrics_log_and_monitor_take_typed_configs(tmp_path):
    MetricsLog(tmp_path, wandb_cfg=WandbConfig(mode="disabled"), run_id="r", config={}, resume_step=0)
    assert (
        build_monitor(
            train_config(compose_config(["experiment=cpu_debug"])), {}, device=torch.device("cpu"), autocast=None
        ).every
        == 0
    )


def test_allowed_values_are_the_registries_own_lists():
    from eigtrain.engine import optim
    from eigtrain.schema import OPTIM_SCHEMAS

    assert optim.OPTIMIZERS == tuple(OPTIM_SCHEMAS)  # the Literal aliases: tests/config/test_schema_leaf.py
