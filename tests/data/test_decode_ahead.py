"""Batches finished ahead on a background thread: same batches in the same order, errors at the batch where they
happened, a thread that ends with its consumer (the data cursor counts only the batches taken:
tests/data/test_data_resume.py)."""

import threading
import time

import pytest
import torch

from eigtrain.data import decode_ahead


def finish_in_thread(monkeypatch, fail_at=None):
    """finish_batch replaced by one that records the thread it ran on (and fails at batch `fail_at`)."""
    threads = []

    def finish(batch, spec, device, decoder):
        threads.append(threading.current_thread().name)
        if batch["n"] == fail_at:
            raise ValueError(f"batch {fail_at} cannot be finished")
        return {**batch, "finished": True}

    monkeypatch.setattr(decode_ahead, "finish_batch", finish)
    return threads


def test_batches_are_finished_on_another_thread_in_order(monkeypatch):
    threads = finish_in_thread(monkeypatch)
    got = list(decode_ahead.finished_ahead(({"n": i} for i in range(7)), None, torch.device("cpu")))
    assert got == [{"n": i, "finished": True} for i in range(7)]
    assert set(threads) == {"jpeg-decode-ahead"}


@pytest.mark.parametrize("where", ["loader", "finish"])
def test_an_error_is_raised_at_the_batch_where_it_happened(monkeypatch, where):
    finish_in_thread(monkeypatch, fail_at=3 if where == "finish" else None)

    def batches():
        for i in range(6):
            if where == "loader" and i == 3:
                raise RuntimeError("a loader worker died")
            yield {"n": i}

    got = []
    with pytest.raises(ValueError if where == "finish" else RuntimeError, match="cannot be finished|worker died"):
        for batch in decode_ahead.finished_ahead(batches(), None, torch.device("cpu")):
            got.append(batch["n"])
    assert got == [0, 1, 2]


def test_the_thread_ends_when_its_consumer_stops(monkeypatch):
    finish_in_thread(monkeypatch)
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield {"n": i}
            i += 1

    batches = decode_ahead.finished_ahead(endless(), None, torch.device("cpu"))
    assert next(batches)["n"] == 0
    batches.close()
    deadline = time.monotonic() + 5
    while any(t.name == "jpeg-decode-ahead" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "jpeg-decode-ahead" for t in threading.enumerate())
    assert len(pulled) <= 1 + decode_ahead.AHEAD + 1  # read ahead by a bounded number of batches only


def test_finishing_overlaps_the_consumers_step(monkeypatch):
    """The point of the thread: a batch is finished while the consumer works on the one before (sleeps stand for
    nvJPEG holding its thread and for the training thread launching a step)."""

    def slow_finish(batch, spec, device, decoder):
        time.sleep(0.05)
        return batch

    monkeypatch.setattr(decode_ahead, "finish_batch", slow_finish)
    start = time.monotonic()
    for _ in decode_ahead.finished_ahead(({"n": i} for i in range(8)), None, torch.device("cpu")):
        time.sleep(0.05)
    assert time.monotonic() - start < 0.7  # one after the other: >= 0.8 s; overlapped: ~0.45 s
