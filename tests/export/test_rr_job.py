"""eigtrain-rr on trained runs: two ranks over uneven shards, counts checked against the index; the ordered
export beats random coordinates after a short CPU pretraining on digits."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from sklearn.datasets import load_digits

from eigtrain.data import read_index
from eigtrain.evaluate.command import main as eval_main
from eigtrain.export.command import main as rr_main
from eigtrain.train.command import compose_config, run
from tests.support.ordering import assert_descending_outside_ties

QUIET = ["logging.progress=false", "logging.wandb.mode=disabled"]


def _torchrun(module_args, nproc=2):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "-m",
        *module_args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def views_run(tmp_path_factory):
    """SCL with joint nesting, tiny CNN, digits (uneven shards of 200: 7 x 200 + 38 train samples)."""
    root = tmp_path_factory.mktemp("views")
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            f"run_dir={root / 'run'}",
            f"data.root={root / 'digits'}",
            "nesting=joint",
            "steps=80",
            "checkpoint_every=80",
            *QUIET,
        ]
    )
    run(cfg)
    return root / "run", root / "digits"


@pytest.mark.slow
def test_two_rank_reduction_reads_every_sample_once(views_run):
    run_dir, digits = views_run
    _torchrun(["eigtrain.export.command", f"run_dir={run_dir}", f"out={run_dir / 'rr2'}", "num_workers=2"])
    manifest = json.loads((run_dir / "rr2" / "manifest.json").read_text())
    assert manifest["n"] == read_index(digits).num_samples("train") == 1438
    assert manifest["source"]["kind"] == "checkpoint" and len(manifest["source"]["sha256"]) == 64
    # The views of a batch depend on its sample keys, not on the rank: 1 rank x 4 workers (the same 4 reader
    # slots) gives the same augmented pairs, so the same export up to float64 rounding.
    assert rr_main([f"run_dir={run_dir}", f"out={run_dir / 'rr1'}", "num_workers=4"]) == 0
    one, two = (load_file(str(run_dir / d / "rr.safetensors")) for d in ("rr1", "rr2"))
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-9 * one[key].abs().max().item(), msg=key)


@pytest.mark.slow
def test_rr_at_dim_4_beats_random_coordinates(views_run, tmp_path):
    run_dir, _ = views_run
    assert rr_main([f"run_dir={run_dir}"]) == 0
    values = load_file(str(run_dir / "rr" / "rr.safetensors"))["eigenvalues"]
    assert_descending_outside_ties(values, json.loads((run_dir / "rr" / "manifest.json").read_text())["ties"])
    assert (
        eval_main([f"run_dir={run_dir}", f"out={tmp_path}", "probe=closed_form", "random_draws=30", "dims=[4,16]"]) == 0
    )
    report = json.loads((tmp_path / "report.json").read_text())
    acc = report["accuracy"]
    # Margin stated: RR's first 4 ordered features beat 4 random coordinates by at least 5 points, and the
    # first 4 beat the last 4. After 80 steps the top-4 subspace still depends on the RR pass's augmentation
    # draw: RR@4 measured 51-61 over rr seeds 0-3 on one trained model, RS@4 43.5 (closed-form probe).
    assert acc["RR"]["4"] > acc["RS"]["4"] + 0.05, acc
    assert report["ordering"]["4"]["top"] > report["ordering"]["4"]["bottom"] + 0.1


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory):
    """Stored pairs (digit image, noisy 10-d class vector), LoRA with two encoders; augmentation off, so
    the reduction is a deterministic function of the samples."""
    root = tmp_path_factory.mktemp("pairs")
    images, labels = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    a = np.eye(10)[labels] + 0.5 * rng.normal(size=(len(labels), 10))
    np.savez(
        root / "pairs.npz",
        x=(images * 16).clip(0, 255).astype(np.uint8).reshape(-1, 8, 8),
        a=a.astype(np.float32),
        y=labels,
    )
    from eigtrain.data.write import main as shards_main

    shards_main(["source=npz", f"path={root / 'pairs.npz'}", f"out={root / 'shards'}", "shard_size=173"])
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            f"run_dir={root / 'run'}",
            "data=pairs",
            f"data.root={root / 'shards'}",
            "objective=lora",
            "steps=30",
            "checkpoint_every=30",
            "+model.context={backbone: mlp, projector_layers: 0, projector_batch_norm: false}",
            *QUIET,
        ]
    )
    run(cfg)
    return root / "run", root / "shards"


@pytest.mark.slow
def test_two_rank_pairs_reduction_equals_single_process(pairs_run):
    run_dir, shards = pairs_run
    assert rr_main([f"run_dir={run_dir}", "mode=svd", f"out={run_dir / 'rr1'}", "num_workers=0"]) == 0
    _torchrun(["eigtrain.export.command", f"run_dir={run_dir}", "mode=svd", f"out={run_dir / 'rr2'}", "num_workers=1"])
    one, two = (load_file(str(run_dir / d / "rr.safetensors")) for d in ("rr1", "rr2"))
    sides = {"eigenvalues", "transform", "mean", "right_transform", "right_mean"}  # both conventions; the constant
    assert set(one) == sides | {f"paper_{k}" for k in sides} | {
        "trivial_eigenvalue",
        "trivial_transform",
        "trivial_right_transform",
    }
    for key in one:  # float64 sums merged in another order: equal up to rounding, relative to the tensor's scale
        scale = one[key].abs().max().item() or 1.0
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-9 * scale, msg=key)
    n = read_index(shards).num_samples("train")
    for d in ("rr1", "rr2"):
        assert json.loads((run_dir / d / "manifest.json").read_text())["n"] == n
