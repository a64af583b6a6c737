"""Logging works where wandb is not installed (the offline GPU machine): metrics.jsonl only, one warning line."""

import logging
import sys

from eigtrain.schema import WandbConfig
from eigtrain.train.metrics_log import MetricsLog, read_metrics


def test_metrics_log_without_wandb_logs_to_jsonl_and_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError, as when it is absent
    with caplog.at_level(logging.WARNING):
        log = MetricsLog(tmp_path, wandb_cfg=WandbConfig(mode="offline"), run_id="r", config={}, resume_step=0)
        log.log(1, {"loss": 0.5})
        log.close()
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.5}]
    warnings = [r.getMessage() for r in caplog.records if "wandb" in r.getMessage()]
    assert len(warnings) == 1 and "not installed" in warnings[0] and "metrics.jsonl" in warnings[0], warnings
