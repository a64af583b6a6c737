"""Checkpoints verified (checksums at save, checked at load, fallback to the newest step that verifies), one writer per
run directory (the trainer's lock), readers pinning the step they read against pruning, and resume lineage."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import socket
import time

import pytest
import torch
from omegaconf import OmegaConf

from eigtrain.runs import checkpoint as ckpt
from eigtrain.runs.checkpoint_read import CheckpointReadError
from eigtrain.runs.checkpoint_verify import CHECKSUMS, check_step, newest_verified
from eigtrain.runs.lineage import LINEAGE_FILE, check_resume
from eigtrain.runs.lock import RunDirInUse, RunLock, pinned
from eigtrain.schema import TrainConfig
from tests.train.test_checkpoint import _engine, _train


def saved(tmp_path, steps=(1, 2), keep_last=3):
    engine = _engine()
    saver = ckpt.Checkpointer(tmp_path, engine, TrainConfig(keep_last=keep_last))
    for s in steps:
        _train(engine, 1, seed=s)
        saver.save(s, {"step": s}, {"data": {"batches": s}})
    return engine, saver


def test_checksums_are_written_before_the_marker_and_name_every_file(tmp_path):
    _, _ = saved(tmp_path, steps=(1,))
    step = tmp_path / "step-1"
    marker = json.loads((step / ckpt.MARKER).read_text())
    files = json.loads((step / CHECKSUMS).read_text())["files"]
    assert marker["checksums"] == CHECKSUMS
    assert set(files) == {".metadata", "__0_0.distcp", "rank-0.pt", "trainer.json"}


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp", "rank-0.pt", "trainer.json"])
@pytest.mark.parametrize("damage", ["bit-flip", "truncated", "empty", "missing"])
def test_a_damaged_newest_step_is_skipped_and_resume_takes_the_one_before(tmp_path, caplog, name, damage):
    a, _ = saved(tmp_path)
    file = tmp_path / "step-2" / name
    data = file.read_bytes()
    if damage == "bit-flip":  # same size, one bit: only a checksum sees it
        file.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "missing":
        file.unlink()
    else:
        file.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    b = _engine(seed=3)
    path, trainer_state, rank_state = ckpt.Checkpointer(tmp_path, b, TrainConfig()).resume()
    assert path == tmp_path / "step-1" and trainer_state == {"step": 1} and rank_state == {"data": {"batches": 1}}
    assert f"skipping checkpoint {tmp_path / 'step-2'}: " in caplog.text and name in caplog.text
    with pytest.raises(ValueError, match=f"fails verification: .*{name}"):
        check_step(tmp_path / "step-2")


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp", "rank-0.pt", "trainer.json"])
def test_corrupt_files_of_an_unverified_step_give_one_cannot_read_line(tmp_path, name):
    """A checkpoint written before checksums (its marker announces none): a corrupt file is one line naming it."""
    saved(tmp_path, steps=(1,))
    step = tmp_path / "step-1"
    (step / ckpt.MARKER).write_text(json.dumps({"step": 1, "world_size": 1}))
    (step / name).write_bytes((step / name).read_bytes()[:7])
    with pytest.raises(CheckpointReadError, match=r"^cannot read .*step-1") as error:
        ckpt.Checkpointer(tmp_path, _engine(), TrainConfig()).resume()
    assert "\n" not in str(error.value)


def test_a_step_without_its_marker_is_never_read(tmp_path):
    saved(tmp_path, steps=(1,))
    (tmp_path / "step-1" / ckpt.MARKER).unlink()
    with pytest.raises(CheckpointReadError, match="not complete"):
        check_step(tmp_path / "step-1")
    assert newest_verified(tmp_path) is None


def test_pruning_keeps_a_step_a_reader_holds(tmp_path, caplog):
    engine, saver = saved(tmp_path, steps=(1,), keep_last=1)
    with pinned(tmp_path / "step-1") as present:
        assert present
        saver.save(2, {"step": 2}, {"data": {"batches": 2}})  # keep_last=1 would delete step-1
        assert (tmp_path / "step-1" / "__0_0.distcp").is_file()
        assert ckpt.model_weights(tmp_path / "step-1")  # still whole: the reader can finish
    assert "step-1 is being read" in caplog.text
    saver.save(3, {"step": 3}, {"data": {"batches": 3}})  # released: the next save prunes it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3"]


def test_a_reader_blocked_by_a_pruner_learns_the_step_is_gone(tmp_path):
    saved(tmp_path, steps=(1, 2), keep_last=3)
    ckpt._delete([tmp_path / "step-1"])
    with pinned(tmp_path / "step-1") as present:
        assert not present


def _hold_lock(run_dir, ready, done):
    RunLock(run_dir)
    ready.set()
    done.wait(30)


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_frees_it(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(tmp_path, ready, done))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(RunDirInUse, match=rf"host {socket.gethostname()}, pid {holder.pid}, since "):
            RunLock(tmp_path)
    finally:
        holder.kill()  # dies holding it: no clean-up runs
        holder.join()
    lock = RunLock(tmp_path)  # the kernel released the dead holder's flock
    assert json.loads((tmp_path / ".eigtrain-lock").read_text())["pid"] == os.getpid()
    lock.release()


def _hold_lock_and_fork(run_dir, ready, child_pid):
    """Take the lock, then fork a child (as a data-loader worker is forked) that outlives this process a while."""
    RunLock(run_dir)
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    child_pid.value = pid
    ready.set()
    time.sleep(60)


def test_a_restart_right_after_sigkill_takes_the_lock_though_forked_workers_live_on(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready, child = ctx.Event(), ctx.Value("i", 0)
    holder = ctx.Process(target=_hold_lock_and_fork, args=(tmp_path, ready, child))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(RunDirInUse):
            RunLock(tmp_path)
        (tmp_path / ".eigtrain-lock").unlink()  # deleting the holder's name does not free the directory
        with pytest.raises(RunDirInUse, match="holder unknown"):
            RunLock(tmp_path)
        holder.kill()  # SIGKILL, as the OOM killer does; its forked child is still alive
        holder.join()
        os.kill(child.value, 0)  # (raises if the child had ended)
        lock = RunLock(tmp_path)  # at once: the child closed its copy when it was forked
        lock.release()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.value, signal.SIGKILL)


def test_resume_lineage_refuses_a_changed_key_and_records_an_override(tmp_path):
    saved_cfg = OmegaConf.create({"objective": {"name": "scl"}, "dim": 4, "data": {"shards": "a", "num_workers": 1}})
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved_cfg))
    same = OmegaConf.merge(saved_cfg, {"data": {"num_workers": 4}})  # how to run, not what a step is
    assert check_resume(tmp_path, same, 5, False) == ""
    other = OmegaConf.merge(saved_cfg, {"objective": {"name": "lora"}})
    refusal = check_resume(tmp_path, other, 5, False)
    assert "objective changed from {'name': 'scl'} to {'name': 'lora'}" in refusal and "new_lineage=true" in refusal
    assert not (tmp_path / LINEAGE_FILE).exists()
    assert check_resume(tmp_path, other, 5, True) == ""
    record = json.loads((tmp_path / LINEAGE_FILE).read_text())
    assert record["step"] == 5 and record["changed"] == {"objective": [{"name": "scl"}, {"name": "lora"}]}


def test_model_weights_of_a_dcp_step_need_no_module(tmp_path):
    engine, _ = saved(tmp_path, steps=(1,))
    weights = ckpt.model_weights(tmp_path / "step-1")
    assert weights.keys() == engine.model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in engine.model.state_dict().items())


ZERO3_SAFE_READ = """
import json, pickle, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
import eigtrain.train.command as train_module
from eigtrain.runs import checkpoint as ckpt
from eigtrain.runs.checkpoint_read import CheckpointReadError
from eigtrain.runs.checkpoint_verify import write_checksums
train_module.run(train_module.compose_config(sys.argv[2:]))
run, out = Path(sys.argv[1]), {}
weights, final = ckpt.model_weights(run / "checkpoints/step-2"), load_file(str(run / "model.safetensors"))
out["same_as_export"] = weights.keys() == final.keys() and all(torch.equal(weights[k], final[k]) for k in final)
marker = run / "code-ran"
class Planted:
    def __reduce__(self):
        return (open, (str(marker), "w"))
out["refused"] = {}
for name in ("zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
    copy = run / "planted" / "step-2"
    shutil.rmtree(copy.parent, ignore_errors=True)
    shutil.copytree(run / "checkpoints/step-2", copy)
    (copy / name).write_bytes(pickle.dumps(Planted(), protocol=2))
    write_checksums(copy, skip=(ckpt.OWNER, ckpt.MARKER))
    try:
        ckpt.model_weights(copy)
    except CheckpointReadError as error:
        out["refused"][name] = str(error)
out["ran"] = marker.exists()
print("RESULT", json.dumps(out))
"""


@pytest.mark.slow
def test_zero3_weights_are_gathered_without_unpickling_code(digits_root, tmp_path):
    """ZeRO-3 partitions gathered weights-only (DeepSpeed's zero_to_fp32 loads with weights_only=False): the same
    weights as the run's export, and a planted pickle in either partition file refused in one line, never run."""
    from tests.support.runs import REPO, overrides, run_cli

    run_dir = tmp_path / "run"
    ds = ("engine=deepspeed", "engine.zero_stage=3", "steps=2", "checkpoint_every=1")
    out = run_cli(["-c", ZERO3_SAFE_READ, str(run_dir), *overrides(run_dir, digits_root, *ds)], REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    assert result["same_as_export"] and not result["ran"], result
    assert len(result["refused"]) == 2 and all(m.startswith("cannot read ") for m in result["refused"].values())


def test_a_save_after_falling_back_is_never_pruned_for_the_step_that_failed(tmp_path):
    """Steps 2 and 4 saved, 4 damaged: resume from 2, then (keep_last=1) a stop-signal save at step 3. Step 4 is no
    step of this lineage: pruning keeps the step just written, not it."""
    engine, saver = saved(tmp_path, steps=(2, 4), keep_last=2)
    (tmp_path / "step-4" / "trainer.json").write_text("{}")  # fails its checksum
    path, _, _ = ckpt.Checkpointer(tmp_path, engine, TrainConfig(keep_last=1)).resume()
    assert path == tmp_path / "step-2"
    ckpt.Checkpointer(tmp_path, engine, TrainConfig(keep_last=1)).save(3, {"step": 3}, {"data": {"batches": 3}})
    assert (tmp_path / "step-3").is_dir() and newest_verified(tmp_path) == tmp_path / "step-3"
