"""Two CPU processes under torchrun (gloo): DeepSpeed ZeRO-2 resumed exactly after a SIGKILL of rank 0 mid-run
(which torchrun turns into the end of the whole job); and DeepSpeed's skipping of non-finite updates. DDP's stop at
N/2 and exact resume on 2 processes is tests/data/test_data_foreign.py's (over HTTP): one DDP train + resume path."""

import json
import sys
import time

import pytest

from eigtrain.runs import checkpoint as ckpt
from eigtrain.train.metrics_log import read_metrics
from tests.support.runs import (
    KILL_WRAPPER,
    REPO,
    assert_same_final_weights,
    check,
    losses,
    overrides,
    run_cli,
    torchrun,
)

pytestmark = pytest.mark.slow


def test_deepspeed_zero2_two_processes_sigkill_and_resume_bit_identical(digits_root, tmp_path):
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    ds = ("engine=deepspeed", "engine.zero_stage=2")
    check(torchrun(tmp_path, ["-m", "eigtrain.train.command"], *overrides(reference, digits_root, *ds)))
    step6 = reference / "checkpoints/step-6"
    assert {
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "rank-0.pt",
        "rank-1.pt",
        ckpt.MARKER,
    } <= {p.name for p in step6.iterdir()}

    start = time.monotonic()
    killed = torchrun(tmp_path, [KILL_WRAPPER], "step", "5", *overrides(resumed, digits_root, *ds))
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    assert time.monotonic() - start < 240  # rank 1 does not hang after rank 0 died
    assert ckpt.latest_checkpoint(resumed / "checkpoints") == resumed / "checkpoints/step-4"
    check(torchrun(tmp_path, ["-m", "eigtrain.train.command"], *overrides(resumed, digits_root, *ds)))
    assert losses(resumed) == losses(reference)
    assert_same_final_weights(resumed, reference)


DEEPSPEED_NAN = """
import json, sys
import torch
import eigtrain.train.command as train_module
from eigtrain.runs import checkpoint as ckpt
from tests.support.faulty import Faulty
build = train_module.build_objective
train_module.build_objective = lambda *a, **k: Faulty(build(*a, **k), nan_loss_calls={3}, nan_grad_calls={4})
result = train_module.run(train_module.compose_config(sys.argv[2:]))
w2, w4 = (ckpt.model_weights(f"{sys.argv[1]}/checkpoints/step-{s}") for s in (2, 4))
same = all(torch.equal(w2[k], w4[k]) for k in w2 if "running_" not in k and "num_batches" not in k)
print("RESULT", json.dumps({"skipped": result["skipped_steps"], "params_unchanged": same}))
"""


def test_deepspeed_skips_nonfinite_updates(digits_root, tmp_path):
    # In a subprocess: DeepSpeed keeps its process group for the life of the process.
    run_dir = tmp_path / "run"
    args = overrides(run_dir, digits_root, "engine=deepspeed", "steps=4", "checkpoint_every=1", "max_nonfinite_steps=2")
    out = run_cli(["-c", DEEPSPEED_NAN, str(run_dir), *args], REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1])
    assert result == {"skipped": 2, "params_unchanged": True}  # NaN loss (step 3), NaN gradient (step 4)
    assert [r["skipped_steps"] for r in read_metrics(run_dir)] == [0, 0, 1, 2]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
