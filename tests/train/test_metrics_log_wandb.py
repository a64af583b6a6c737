"""What wandb receives: every metrics.jsonl value, and the spectrum as one curve per eigenvalue."""

import sys
import types

from eigtrain.schema import WandbConfig
from eigtrain.train.metrics_log import WANDB_EIGENVALUES, MetricsLog, read_metrics


class _FakeRun:
    def __init__(self):
        self.logged = []

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        pass


def test_wandb_gets_one_curve_per_eigenvalue_and_the_jsonl_keeps_the_whole_spectrum(tmp_path, monkeypatch):
    run = _FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kwargs: run))
    log = MetricsLog(tmp_path, wandb_cfg=WandbConfig(mode="offline"), run_id="r", config={}, resume_step=0)
    spectra = [[0.9 - 0.001 * i - 0.01 * step for i in range(WANDB_EIGENVALUES + 6)] for step in (1, 2)]
    for step, spectrum in zip((1, 2), spectra):
        log.log(step, {"loss": -step, "eigenvalues": spectrum})
    log.close()
    assert [r["eigenvalues"] for r in read_metrics(tmp_path)] == spectra  # all of it, on disk
    for (step, data), spectrum in zip(run.logged, spectra):
        curves = {k: v for k, v in data.items() if k.startswith("eigenvalue/")}
        assert "eigenvalues" not in data and data["loss"] == -step
        assert list(curves) == [f"eigenvalue/{i:03d}" for i in range(1, WANDB_EIGENVALUES + 1)]
        assert list(curves.values()) == spectrum[:WANDB_EIGENVALUES]
