"""The chaos drill (issue 52): the trainer SIGKILLed at random moments (mid-step, mid-save; its data worker left to
die after it) and restarted at once, nine times; the run then finishes with every logged loss equal to an uninterrupted run's, bit for
bit. A restart is never refused (the lock dies with the trainer), a half-written checkpoint is never resumed from,
and the metrics log reads as one uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import time

import pytest

from tests.support.runs import overrides, start_trainer

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

STEPS, KILLS = 30, 9
ARGS = (f"steps={STEPS}", "checkpoint_every=3", "data.num_workers=1", "keep_last=2")


def _start(run_dir, digits_root, tmp_path):
    return start_trainer(overrides(run_dir, digits_root, *ARGS), tmp_path, stdout=subprocess.DEVNULL)


def _logged(run_dir) -> dict[int, str]:
    """{step: loss as written} from metrics.jsonl (its text: bit-for-bit comparable)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [json.loads(line) for line in lines if line.strip()]
    return {r["step"]: repr(r["loss"]) for r in rows if "loss" in r}


def _wait_for_step(proc, run_dir, step: int, deadline: float) -> bool:
    while max(_logged(run_dir), default=0) < step:
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_killed_at_random_moments_and_restarted_at_once_it_logs_the_uninterrupted_losses(digits_root, tmp_path):
    reference = tmp_path / "reference"
    proc = _start(reference, digits_root, tmp_path)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]

    run_dir, rng, kills = tmp_path / "chaos", random.Random(0), 0
    deadline = time.monotonic() + 480
    while kills < KILLS:
        proc = _start(run_dir, digits_root, tmp_path)
        done = max(_logged(run_dir), default=0)
        # progress of one to three steps past where it resumed, then a random moment within the next step or save
        if not _wait_for_step(proc, run_dir, min(done + rng.randint(1, 3), STEPS - 1), deadline):
            break
        time.sleep(rng.uniform(0, 0.3))
        if proc.poll() is not None:
            break
        os.kill(proc.pid, signal.SIGKILL)  # the trainer alone, as the OOM killer does: its worker outlives it a while
        proc.wait()
        kills += 1
    assert kills == KILLS, f"the run ended or stalled after {kills} kills: {proc.stderr.read()[-3000:]}"
    proc = _start(run_dir, digits_root, tmp_path)  # at once, and to the end
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    assert _logged(run_dir) == _logged(reference) and len(_logged(reference)) == STEPS
