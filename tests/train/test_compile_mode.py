"""engine.compile_mode: CUDA graphs (reduce-overhead) only where they hold (CUDA, the ddp engine, one micro-batch
per step), else the default mode with one warning naming why; the engine compiles its module with the mode chosen."""

import pytest
import torch
from torch import nn

from eigtrain.engine import build_engine, compile_mode
from eigtrain.schema import EngineConfig, SGDConfig


@pytest.mark.parametrize(
    ("device", "engine", "accum", "why"),
    [
        ("cpu", "ddp", 1, "need a CUDA device"),
        ("cuda", "deepspeed", 1, "engine.name=deepspeed runs its own step"),
        ("cuda", "ddp", 2, "2 micro-batches per step"),
    ],
)
def test_cuda_graphs_fall_back_to_the_default_mode_saying_why(device, engine, accum, why):
    with pytest.warns(UserWarning, match=why):
        assert compile_mode("reduce-overhead", torch.device(device), engine, accum) == "default"
    with pytest.warns(UserWarning, match=why):
        assert compile_mode("max-autotune", torch.device(device), engine, accum) == "max-autotune-no-cudagraphs"


def test_cuda_graphs_are_kept_where_they_hold_and_unknown_modes_refused():
    assert compile_mode("reduce-overhead", torch.device("cuda"), "ddp", 1) == "reduce-overhead"
    assert compile_mode("default", torch.device("cpu"), "deepspeed", 4) == "default"
    with pytest.raises(ValueError, match="engine.compile_mode='fast' is not known"):
        compile_mode("fast", torch.device("cpu"), "ddp", 1)


def test_the_cpu_engine_compiles_with_the_fallback_mode_and_steps(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda module, mode=None: seen.append(mode) or module)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    cfg = EngineConfig(name="ddp", compile=True, compile_mode="reduce-overhead", precision="fp32")
    with pytest.warns(UserWarning, match="CUDA graphs need a CUDA device"):
        engine = build_engine(
            cfg, SGDConfig(lr=0.1), model, device=torch.device("cpu"), micro_batch_size=4, grad_accum_steps=1
        )
    assert seen == ["default"] and not engine.cuda_graphs
    before = [p.detach().clone() for p in model.parameters()]
    result = engine.train_step([torch.randn(4, 12)], lambda module, x: (module(x).square().mean(), {}), lr=0.1)
    assert bool(result.applied) and not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize(
    ("device", "engine", "accum", "view_hw", "expected"),
    [
        ("cuda", "ddp", 1, [32, 32], "reduce-overhead"),  # small views: launch-bound, CUDA graphs
        ("cuda", "ddp", 1, [64, 48], "reduce-overhead"),
        ("cuda", "ddp", 1, [224, 224], "default"),  # large views: the kernels hide their launches
        ("cuda", "ddp", 1, None, "default"),  # not images (vectors): no evidence, the plain mode
        ("cuda", "ddp", 2, [32, 32], "default"),  # gradient caching: graphs would overwrite kept embeddings
        ("cuda", "deepspeed", 1, [32, 32], "default"),
        ("cpu", "ddp", 1, [32, 32], "default"),
    ],
)
def test_auto_takes_cuda_graphs_only_for_small_views_where_they_hold(device, engine, accum, view_hw, expected):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto decides silently
        assert compile_mode("auto", torch.device(device), engine, accum, view_hw) == expected


def test_auto_is_the_default_and_the_trainer_hands_the_view_size_to_the_engine(monkeypatch):
    assert EngineConfig().compile_mode == "auto"
    seen = []
    monkeypatch.setattr(torch, "compile", lambda module, mode=None: seen.append(mode) or module)
    cfg = EngineConfig(name="ddp", compile=True, precision="fp32")
    build_engine(
        cfg,
        SGDConfig(lr=0.1),
        nn.Linear(3, 2),
        device=torch.device("cpu"),
        micro_batch_size=4,
        grad_accum_steps=1,
        view_hw=[32, 32],
    )
    assert seen == ["default"]  # on the CPU: no graphs, and no warning either
