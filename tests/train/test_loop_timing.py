"""Each component of the training loop decides its own timing: the checkpointer when to save (signals included),
the reporter when to log, the monitor when to score; the loop state counts skipped updates. Unit tests of those
decisions, and of the loop function's shape (short, no closures)."""

import ast
import inspect
import os
import signal
import textwrap

import pytest
import torch
import torch.distributed as torch_dist

from eigtrain import dist
from eigtrain.runs.checkpoint import Checkpointer
from eigtrain.schema import TrainConfig
from eigtrain.train import command as train
from eigtrain.train.metrics_log import Reporter, Throughput
from eigtrain.train.monitor import MonitorSchedule
from eigtrain.train.state import NonFiniteError, TrainState


def saves(checkpoints: Checkpointer, last_step: int, skipped=()) -> list[int]:
    return [s for s in range(1, last_step + 1) if checkpoints.should_save(s, last_step, applied=s not in skipped)]


def test_checkpointer_saves_every_checkpoint_every_steps_and_at_the_last_step(tmp_path):
    assert saves(Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=3)), 7) == [3, 6, 7]
    assert saves(Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=2)), 6) == [2, 4, 6]
    assert saves(Checkpointer(tmp_path, None, TrainConfig()), 5) == [5], (
        "checkpoint_every past the last step: only the last step"
    )


def test_a_periodic_save_waits_for_an_applied_update_but_the_last_one_never_waits(tmp_path):
    # Updates skipped at steps 3 and 4: the save due at step 3 happens at step 5, the next one on time at 6;
    # the last step (8) saves even though its update was skipped.
    assert saves(Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=3)), 8, skipped={3, 4, 8}) == [5, 6, 8]
    checkpoints = Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=2))
    assert checkpoints.due(2, 10) and not checkpoints.should_save(2, 10, applied=torch.tensor(False))
    assert checkpoints.due(3, 10), "a deferred save keeps the next step due (the host reads the counters there)"
    assert checkpoints.should_save(3, 10, applied=torch.tensor(True)) and not checkpoints.due(5, 10)


@pytest.fixture
def stop_handler(monkeypatch):
    """SIGUSR1 as a stop signal (as launch/ installs SIGTERM); the process's flags and handler restored after."""
    for name in ("installed", "received", "requeue_signal", "stopped", "requeue"):
        monkeypatch.setattr(dist._StopState, name, getattr(dist._StopState, name))
    previous = signal.getsignal(signal.SIGUSR1)
    dist.install_stop_handler(requeue_signal=None, stop_signals=(signal.SIGUSR1,))
    yield lambda: os.kill(os.getpid(), signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, previous)


def test_a_stop_signal_saves_at_the_next_step_boundary(tmp_path, stop_handler):
    checkpoints = Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=100))
    assert not checkpoints.should_save(1, 10) and not checkpoints.stop_requested
    stop_handler()
    assert checkpoints.should_save(2, 10, applied=False), "a stop saves even after a skipped update"
    assert checkpoints.stop_requested


def test_in_a_process_group_the_ranks_agree_on_a_signal_every_signal_check_every_steps(tmp_path, stop_handler):
    torch_dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        checkpoints = Checkpointer(tmp_path, None, TrainConfig(checkpoint_every=100, signal_check_every=4))
        stop_handler()
        assert [s for s in range(1, 5) if checkpoints.should_save(s, 10)] == [4], "the signal came before step 1"
        assert checkpoints.stop_requested
    finally:
        torch_dist.destroy_process_group()


def test_monitor_scores_every_monitor_every_steps_and_at_the_last_step():
    assert [s for s in range(1, 8) if MonitorSchedule(3).due(s, 7)] == [3, 6, 7]
    assert not any(MonitorSchedule(0).due(s, 7) for s in range(1, 8)), "monitor.every=0: never"


def test_reporter_logs_every_log_every_steps_at_the_last_step_and_when_the_monitor_scores():
    assert [s for s in range(1, 11) if Reporter(4, MonitorSchedule(0)).due(s, 10)] == [4, 8, 10]
    assert [s for s in range(1, 11) if Reporter(4, MonitorSchedule(3)).due(s, 10)] == [3, 4, 6, 8, 9, 10]


def test_a_reporter_without_a_metrics_log_writes_nothing():
    """Ranks other than 0 decide alike but write nothing (and never score)."""
    reporter = Reporter(1, MonitorSchedule(1))
    reporter.log(1, 1, result=None, lr=0.1, state=None, model=None)
    reporter.close()


def test_throughput_times_the_wait_for_the_next_batch():
    throughput = Throughput()
    assert throughput.next(iter([{"x": 1}]), samples=8) == {"x": 1}
    rate, wait = throughput.read()
    assert rate > 0 and 0 <= wait <= 1


def test_train_state_counts_steps_samples_and_skips_only_when_read():
    state = TrainState(torch.device("cpu"), batch_size=32, max_nonfinite_steps=1)
    assert state.advance(torch.tensor(True), usable=True) == 1
    state.advance(torch.tensor(False), usable=True)  # a non-finite update
    state.advance(torch.tensor(False), usable=False)  # a batch without enough usable samples
    assert (state.step, state.samples, state.skipped_steps, state.skipped_batches) == (3, 96, 0, 0), "not read yet"
    state.read_skips(last_checkpoint=None)
    assert (state.skipped_steps, state.skipped_batches) == (1, 1)
    state.read_skips(last_checkpoint=None)
    assert (state.skipped_steps, state.skipped_batches) == (1, 1), "each skip is counted once"
    state.advance(torch.tensor(False), usable=True)
    with pytest.raises(
        NonFiniteError,
        match=r"2 steps .* max_nonfinite_steps=1; stopped at step 4; last good "
        r"checkpoint: step-2",
    ):
        state.read_skips(last_checkpoint="step-2")


def test_train_state_round_trips_through_its_state_dict_and_loads_older_checkpoints():
    state = TrainState(torch.device("cpu"), batch_size=4, max_nonfinite_steps=10)
    state.load_state_dict({"step": 5, "samples": 20, "skipped_steps": 1, "wandb_id": "abc"})  # no skipped_batches yet
    expected = {"step": 5, "samples": 20, "skipped_steps": 1, "skipped_batches": 0, "wandb_id": "abc", "identity": None}
    assert state.state_dict() == expected
    again = TrainState(torch.device("cpu"), batch_size=4, max_nonfinite_steps=10)
    again.load_state_dict(state.state_dict())
    assert again.state_dict() == state.state_dict()


def test_the_training_loop_is_short_and_has_no_closures():
    source = textwrap.dedent(inspect.getsource(train._train))
    assert len(source.splitlines()) <= 60
    loop = ast.parse(source).body[0]
    nested = [n for n in ast.walk(loop) if n is not loop and isinstance(n, (ast.FunctionDef, ast.Lambda))]
    assert not nested, "no function defined inside the loop function"
