"""One place binds each process's device (eigtrain.dist.select_device); train, eigtrain-rr and evaluation use it."""

import torch

from eigtrain import dist
from eigtrain.export.command import select_device as rr_device


def _env(local_rank, local_world=4):
    return dist.DistEnv(local_rank, local_world, local_rank, local_world, 0, 1, "127.0.0.1", 29500, "slurm")


def _gpus(monkeypatch, count):
    bound = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    return bound


def test_one_gpu_per_task_binds_device_0_for_train_and_rr(monkeypatch):
    bound = _gpus(monkeypatch, 1)  # Slurm --gpus-per-task=1: LOCAL_RANK 3 sees a single GPU, cuda:0
    env = _env(3)
    assert dist.select_device(env, "auto") == torch.device("cuda", 0)
    assert rr_device(type("Cfg", (), {"device": "cuda"})(), env) == torch.device("cuda", 0)  # was cuda:3
    assert bound == [torch.device("cuda", 0)] * 2


def test_gpus_shared_by_the_node_bind_local_rank_and_cpu_stays_cpu(monkeypatch):
    _gpus(monkeypatch, 4)
    assert dist.select_device(_env(2), "auto") == torch.device("cuda", 2)
    assert dist.select_device(_env(2), "cpu") == torch.device("cpu")
    _gpus(monkeypatch, 0)
    assert dist.select_device(_env(2), "auto") == torch.device("cpu")
    try:
        dist.select_device(_env(2), "cuda")
    except ValueError as exn:
        assert "no GPU is visible" in str(exn)
    else:
        raise AssertionError("device=cuda without a GPU must fail")
