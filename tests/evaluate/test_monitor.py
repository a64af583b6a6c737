"""Online kNN monitor (monitor.every): accuracy per prefix size in metrics.jsonl, training unchanged."""

import pytest

from eigtrain.train.command import compose_config, run
from eigtrain.train.metrics_log import read_metrics
from tests.support.runs import assert_same_final_weights, losses, overrides


@pytest.mark.slow
def test_monitor_logs_knn_accuracy_per_prefix_and_leaves_training_unchanged(digits_root, tmp_path):
    common = ("steps=4", "log_every=3", "checkpoint_every=4", "monitor.max_train_samples=600")
    run(compose_config(overrides(tmp_path / "plain", digits_root, *common)))
    run(compose_config(overrides(tmp_path / "monitored", digits_root, *common, "monitor.every=2")))
    records = {r["step"]: r for r in read_metrics(tmp_path / "monitored")}
    assert sorted(records) == [2, 3, 4]  # monitor steps 2 and 4 are logged too
    assert "knn/4" not in records[3]
    for step in (2, 4):
        accuracy = [records[step][f"knn/{k}"] for k in (4, 8, 16)]  # dim 16: prefixes {4, 8, 16}
        assert all(0.3 < a <= 1.0 for a in accuracy), accuracy  # digits: far above chance (0.1)
    # Monitoring reads data with its own stream and restores every RNG: the same training, bit for bit.
    assert [v for s, v in losses(tmp_path / "monitored") if s == 3] == [
        v for s, v in losses(tmp_path / "plain") if s == 3
    ]
    assert_same_final_weights(tmp_path / "monitored", tmp_path / "plain")
