"""A batch whose samples were all unusable (corrupt images) is a step every rank skips and counts, not a crash;
past data.max_corrupt the run stops with one line. Real shards on disk with a whole shard of corrupt samples."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from eigtrain.data import CorruptDataError, write_shards
from eigtrain.data.sources import png_bytes
from eigtrain.train.command import compose_config, run
from eigtrain.train.metrics_log import read_metrics
from tests.support.runs import check, run_cli, torchrun

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

META = dict(mode="views", channels=1, image_shape=[1, 8, 8], labels=True)
SHARD = 16  # one shard, read alone and in order (shuffle_block=0, mix_shards=1), is one batch of one rank


def write_data(root, shards=4, corrupt_shard=1, good_in_corrupt_shard=0):
    """8x8 grayscale shards; the samples of shard `corrupt_shard` (but its first `good_in_corrupt_shard`) have bytes
    that are not an image."""
    rng = np.random.default_rng(0)
    bad = range(corrupt_shard * SHARD + good_in_corrupt_shard, (corrupt_shard + 1) * SHARD)
    samples = [
        {
            "__key__": f"s-{i:05d}",
            "cls": i % 10,
            "png": b"not a png" if i in bad else png_bytes(rng.integers(0, 256, (8, 8), dtype=np.uint8)),
        }
        for i in range(shards * SHARD)
    ]
    write_shards(root, {"train": samples}, shard_size=SHARD, meta=META)
    return root


def overrides(run_dir, root, *extra, world=1):
    steps = 4 // world  # one epoch
    return [
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.root={root}",
        "data.write_if_missing=null",
        "data.num_workers=0",
        "data.shuffle_block=0",
        "data.mix_shards=1",
        f"batch_size={SHARD * world}",
        f"steps={steps}",
        "log_every=1",
        f"checkpoint_every={steps}",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        *extra,
    ]


def test_a_batch_of_only_corrupt_samples_is_skipped_and_counted(tmp_path):
    root = write_data(tmp_path / "data")
    result = run(compose_config(overrides(tmp_path / "run", root, f"data.max_corrupt={SHARD}")))
    assert result["step"] == 4 and result["skipped_batches"] == 1 and result["skipped_steps"] == 0  # not non-finite
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["skipped_batches"] == 1 and records[-1]["skipped_steps"] == 0
    assert_finite_weights(tmp_path / "run")


def assert_finite_weights(run_dir):
    """The stand-in's NaN reached neither the weights nor the BatchNorm statistics."""
    weights = load_file(str(run_dir / "model.safetensors"))
    assert weights and all(torch.isfinite(w.float()).all() for w in weights.values())


def test_a_batch_of_one_usable_sample_is_skipped_too(tmp_path):
    root = write_data(tmp_path / "data", good_in_corrupt_shard=1)  # one usable sample: the objective needs 2
    result = run(compose_config(overrides(tmp_path / "run", root, f"data.max_corrupt={SHARD}")))
    assert result["step"] == 4 and result["skipped_batches"] == 1
    assert_finite_weights(tmp_path / "run")


def test_past_max_corrupt_the_run_stops_with_one_line(tmp_path):
    root = write_data(tmp_path / "data")
    with pytest.raises(CorruptDataError, match=f"{SHARD} unusable samples .* more than max_corrupt={SHARD - 1}"):
        run(compose_config(overrides(tmp_path / "run", root, f"data.max_corrupt={SHARD - 1}")))
    cli = run_cli(
        ["-m", "eigtrain.train.command", *overrides(tmp_path / "cli", root, f"data.max_corrupt={SHARD - 1}")], tmp_path
    )
    assert cli.returncode != 0
    last = cli.stderr.strip().splitlines()[-1]
    assert last.startswith("eigtrain-train: 16 unusable samples") and "max_corrupt=15; the last: shard" in last
    assert "Traceback" not in cli.stderr, cli.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ddp", "deepspeed"])
def test_two_ranks_skip_the_step_where_only_one_rank_got_the_bad_batch(tmp_path, engine):

    root = write_data(tmp_path / "data", shards=4)  # 2 shards per rank: the corrupt one goes to one rank only
    run_dir = tmp_path / "run"
    args = overrides(run_dir, root, f"data.max_corrupt={SHARD}", f"engine={engine}", world=2)
    check(torchrun(tmp_path, ["-m", "eigtrain.train.command"], *args, timeout=240))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert records[-1]["skipped_batches"] == 1 and records[-1]["skipped_steps"] == 0
    assert_finite_weights(run_dir)
