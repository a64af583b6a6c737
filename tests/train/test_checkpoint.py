"""Checkpoint directories: marker, discovery, keep-k, RNG state, engine round trip, weights-only loading."""

import json
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from eigtrain.engine.ddp import DDPEngine
from eigtrain.models import build_encoder
from eigtrain.runs import checkpoint as ckpt
from eigtrain.runs.checkpoint_read import WeightsOnlyLoadPlanner
from eigtrain.schema import ModelConfig, SGDConfig, TrainConfig
from eigtrain.train import random_state

OPTIM = SGDConfig(lr=0.1, momentum=0.9, weight_decay=5e-4, grad_clip=3.0)


def make_step(root, step, complete=True):
    path = ckpt.step_dir(root, step)
    path.mkdir(parents=True)
    (path / "shard.bin").write_bytes(b"x" * 10)
    if not complete:  # a save eigtrain began (its ownership file comes first) and never finished
        (path / ckpt.OWNER).write_text("")
    if complete:
        ckpt.mark_complete(path, {"step": step, "world_size": 1})
    return path


def test_discovery_ignores_incomplete_and_orders_numerically(tmp_path):
    for step in (2, 10, 9):
        make_step(tmp_path, step)
    make_step(tmp_path, 12, complete=False)  # a save killed before its marker
    (tmp_path / "step-x").mkdir()  # not a checkpoint name
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [2, 9, 10]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step-10"
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None


def test_marker_is_written_whole(tmp_path):
    path = make_step(tmp_path, 3)
    assert json.loads((path / ckpt.MARKER).read_text()) == {"step": 3, "world_size": 1}
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == []


def test_prune_keeps_last_k_and_drops_stale_partials(tmp_path):
    for step in (1, 2, 3, 4):
        make_step(tmp_path, step)
    make_step(tmp_path, 0, complete=False)
    deleted = ckpt.prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in deleted) == ["step-0", "step-1", "step-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3", "step-4"]
    make_step(tmp_path, 5, complete=False)
    assert [p.name for p in ckpt.remove_incomplete(tmp_path)] == ["step-5"]


def test_rng_state_round_trip_through_weights_only_load(tmp_path):
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    torch.save(random_state.rng_state({"augment": gen}), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=gen))
    torch.manual_seed(99), np.random.seed(99), random.seed(99), gen.manual_seed(99)
    random_state.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), {"augment": gen})
    got = (torch.rand(3), np.random.rand(3), random.random(), torch.rand(3, generator=gen))
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and torch.equal(got[3], expected[3])


def _engine(seed=0):
    torch.manual_seed(seed)
    model = build_encoder(
        ModelConfig(backbone="tiny_cnn", width=4, projector_hidden=8, projector_layers=1), dim=4, input_shape=(1, 8, 8)
    )
    return DDPEngine(model, OPTIM, device=torch.device("cpu"), grad_clip=3.0)


def _train(engine, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    loss_fn = lambda module, x: (module(x).square().mean(), {})  # noqa: E731
    for _ in range(steps):
        engine.train_step([torch.randn(8, 1, 8, 8, generator=gen)], loss_fn, lr=0.05)


def test_engine_checkpoint_round_trip_is_exact(tmp_path):
    a = _engine()
    _train(a, 2)
    saver = ckpt.Checkpointer(tmp_path, a, TrainConfig(keep_last=2))
    path = saver.save(2, {"step": 2, "samples": 16}, {"data": {"batches": 2}})
    assert ckpt.is_complete(path) and ckpt.latest_checkpoint(tmp_path) == path

    b = _engine(seed=1)  # different initial weights, no optimizer state yet
    trainer_state, rank_state = ckpt.Checkpointer(tmp_path, b, TrainConfig()).load(path)
    assert trainer_state == {"step": 2, "samples": 16} and rank_state == {"data": {"batches": 2}}
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(va, vb), k
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(a.optimizer.state[pa]["momentum_buffer"], b.optimizer.state[pb]["momentum_buffer"])
    weights = ckpt.model_weights(path)
    assert all(torch.equal(weights[k], v) for k, v in a.model.state_dict().items())
    _train(a, 2, seed=5), _train(b, 2, seed=5)  # and they continue identically
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.model.parameters(), b.model.parameters()))


def test_resume_with_another_world_size_keeps_the_data_cursor_only(tmp_path, caplog):
    engine = _engine()
    path = ckpt.Checkpointer(tmp_path, engine, TrainConfig()).save(
        1, {"step": 1}, {"data": {"batches": 3}, "rng": {"torch": 0}}
    )
    ckpt.mark_complete(path, {"step": 1, "world_size": 2})  # as if two ranks had written it
    trainer_state, rank_state = ckpt.Checkpointer(tmp_path, engine, TrainConfig()).load(path)
    assert trainer_state == {"step": 1} and rank_state == {"data": {"batches": 3}}  # no per-rank RNG
    assert "written by 2 ranks, this run has 1: resuming, but not exactly" in caplog.text


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_loading_refuses_pickled_objects(tmp_path):
    # A checkpoint whose non-tensor entry is an arbitrary object: the default planner would unpickle
    # (and could execute) it, the weights-only planner refuses.
    dcp.save({"w": torch.ones(2), "extra": Fraction(1, 3)}, checkpoint_id=str(tmp_path), no_dist=True)
    target = {"w": torch.zeros(2), "extra": None}
    with pytest.raises(CheckpointException, match="Unsupported global: GLOBAL fractions.Fraction"):
        dcp.load(target, checkpoint_id=str(tmp_path), planner=WeightsOnlyLoadPlanner(), no_dist=True)


def test_cuda_rng_state_is_this_process_gpu_only(monkeypatch):
    """Saved per device and restored onto this process's GPU, whatever the number of GPUs after a requeue."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # one GPU per task: always device 0
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: torch.tensor([device, 7], dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((state.tolist(), device)))
    state = random_state.rng_state()
    assert state["cuda"].tolist() == [0, 7]
    random_state.set_rng_state(state)
    # A checkpoint of the older format (all 8 GPUs of a node) resumed with one GPU per task: this task's own.
    random_state.set_rng_state({**state, "cuda": [torch.tensor([i, 7], dtype=torch.uint8) for i in range(8)]})
    assert restored == [([0, 7], 0), ([0, 7], 0)]
