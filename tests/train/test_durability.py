"""A checkpoint is marked complete only once every file in it and its directories are on disk (fsynced): a real
DDP save and a real single-process DeepSpeed save, with os.fsync and os.replace recorded in order."""

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from eigtrain import safe_files
from eigtrain.runs import checkpoint as ckpt
from eigtrain.schema import ModelConfig, SGDConfig, TrainConfig

OPTIM = SGDConfig(lr=0.1, momentum=0.9, weight_decay=0.0)


def _model():
    from eigtrain.models import build_encoder

    torch.manual_seed(0)
    return build_encoder(
        ModelConfig(backbone="tiny_cnn", width=4, projector_hidden=8, projector_layers=1), dim=4, input_shape=(1, 8, 8)
    )


def _record(monkeypatch) -> list[tuple[str, str]]:
    """[("fsync", path) | ("replace", destination)] in the order they happen."""
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recording_fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        final = safe_files.temporary_of(path.name)  # a file written through safe_files: synced before its rename
        events.append(("fsync", str(path.with_name(final) if final else path)))
        return fsync(fd)

    def recording_replace(src, dst, **kwargs):
        replace(src, dst, **kwargs)
        events.append(("replace", str(Path(dst).resolve())))

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    return events


def _train_and_save(engine, root: Path, monkeypatch) -> tuple[Path, list[tuple[str, str]]]:
    gen = torch.Generator().manual_seed(0)
    loss_fn = lambda module, x: (module(x).square().mean(), {})  # noqa: E731
    engine.train_step([torch.randn(8, 1, 8, 8, generator=gen)], loss_fn, lr=0.05)  # optimizer state to save
    events = _record(monkeypatch)
    path = ckpt.Checkpointer(root, engine, TrainConfig()).save(1, {"step": 1}, {"data": {"batches": 1}})
    return path.resolve(), events


def _assert_durable_before_marker(path: Path, events: list[tuple[str, str]]) -> None:
    marker = str(path / ckpt.MARKER)
    at = events.index(("replace", marker))
    synced_before = {p for kind, p in events[:at] if kind == "fsync"}
    files = {str(p) for p in path.rglob("*") if p.is_file() and p.name != ckpt.MARKER}
    dirs = {str(p) for p in path.rglob("*") if p.is_dir()} | {str(path), str(path.parent)}
    assert len(files) >= 3, files  # the engine's files, rank-0.pt, trainer.json
    assert files - synced_before == set(), "written but not fsynced before the marker"
    assert dirs - synced_before == set(), "directories not fsynced before the marker"
    assert ("fsync", str(path)) in events[at + 1 :], "the marker's rename is not made durable"


def test_ddp_checkpoint_is_fsynced_before_its_marker(tmp_path, monkeypatch):
    from eigtrain.engine.ddp import DDPEngine

    engine = DDPEngine(_model(), OPTIM, device=torch.device("cpu"), precision="fp32")
    _assert_durable_before_marker(*_train_and_save(engine, tmp_path / "checkpoints", monkeypatch))


def _deepspeed_worker(rank, root):
    from eigtrain.engine.deepspeed_zero import DeepSpeedEngine

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.set_num_threads(1)
    engine = DeepSpeedEngine(
        _model(), OPTIM, device=torch.device("cpu"), stage=2, precision="fp32", micro_batch_size=8, grad_accum_steps=1
    )
    with pytest.MonkeyPatch.context() as monkeypatch:
        path, events = _train_and_save(engine, Path(root), monkeypatch)
    assert any(p.name.startswith("zero_pp_rank_0") for p in path.iterdir()), list(path.iterdir())
    _assert_durable_before_marker(path, events)


@pytest.mark.slow
def test_deepspeed_checkpoint_is_fsynced_before_its_marker(tmp_path):
    # A process of its own: DeepSpeed keeps the process group it makes for the life of the process.
    mp.spawn(_deepspeed_worker, args=(str(tmp_path / "checkpoints"),), nprocs=1, join=True)
