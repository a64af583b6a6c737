"""Runs eigtrain-train after arranging a real SIGKILL of this process (rank 0 only under torchrun):
    python kill_wrapper.py step N ...overrides    dies as the N-th training step of this process starts
    python kill_wrapper.py marker S ...overrides  dies after writing checkpoint S, before its completion marker
A script, not a test module: the trainer tests run it as the program of a subprocess (tests.support.runs)."""

import os
import signal
import sys

import eigtrain.runs.checkpoint as ckpt
from eigtrain.engine.ddp import DDPEngine
from eigtrain.engine.deepspeed_zero import DeepSpeedEngine
from eigtrain.train.command import main


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _die_at_step(cls, at: int, calls: list[int]):
    original = cls.train_step

    def train_step(self, *args, **kwargs):
        calls[0] += 1  # shared by both engines: counts this process's steps
        if calls[0] == at:
            _die()
        return original(self, *args, **kwargs)

    cls.train_step = train_step


def _die_before_marker(at: int):
    original_mark = ckpt.mark_complete

    def mark_complete(path, info):
        if info["step"] == at:
            _die()
        original_mark(path, info)

    ckpt.mark_complete = mark_complete


if __name__ == "__main__":
    mode, at = sys.argv.pop(1), int(sys.argv.pop(1))
    if os.environ.get("RANK", "0") == "0":
        if mode == "step":
            calls = [0]
            _die_at_step(DDPEngine, at, calls)
            _die_at_step(DeepSpeedEngine, at, calls)
        else:
            _die_before_marker(at)
    main()
