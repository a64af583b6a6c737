"""Progress of eigtrain-eval's long steps: one line per step on stderr once the evaluation has run for a while.

A small table (digits, a few hundred vectors) finishes in seconds and prints nothing; at 60,000 vectors a step
(a probe at one size, the random subsets, a retrieval pass) can take a minute, and a user should see which one
runs and how far along the table is. Plain lines, not a live bar: they read the same in a terminal, a Slurm log
and a CI log."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StepProgress:
    def __init__(self, total: int, quiet_s: float = 5.0, stream: TextIO | None = None, name: str = "eigtrain-eval"):
        self.total, self.done, self.quiet_s, self.name = total, 0, quiet_s, name
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()

    def step(self, what: str) -> None:
        """`what` is about to run; say so once the evaluation has been running for `quiet_s` seconds."""
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.quiet_s:
            print(
                f"{self.name}: [{self.done}/{self.total}] {what} ({elapsed:.0f} s so far)", file=self.stream, flush=True
            )
