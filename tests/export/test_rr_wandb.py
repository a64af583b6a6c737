"""eigtrain-rr on a run logs the exported Rayleigh-Ritz spectrum to the run's own wandb run, as its own curve
(eigenvalue against feature) and summary values, apart from the training's per-coordinate curves (issue 55)."""

import json
import sys
import types

import pytest

from eigtrain.export.command import main as rr_main
from eigtrain.train import command as train_command
from tests.support.runs import overrides


class _FakeRun:
    def __init__(self, calls, **kwargs):
        self.kwargs, self.logged, self.summary = kwargs, [], {}
        calls.append(self)

    def log(self, data, step=None):
        self.logged.append(data)

    def finish(self):
        pass


def _fake_wandb(calls, fail=False):
    def init(**kwargs):
        if fail:
            raise RuntimeError("no network")
        return _FakeRun(calls, **kwargs)

    def line(table, x, y, title):
        return {"table": table, "x": x, "y": y, "title": title}

    table = lambda columns, data: {"columns": columns, "data": data}  # noqa: E731
    return types.SimpleNamespace(init=init, Table=table, plot=types.SimpleNamespace(line=line))


@pytest.fixture(scope="module")
def wandb_run(digits_root, tmp_path_factory):
    """A two-step run that logs to wandb (offline) through a stand-in module."""
    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    calls: list = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "wandb", _fake_wandb(calls))
        args = overrides(run_dir, digits_root, "steps=2", "checkpoint_every=2", "logging.wandb.mode=offline")
        train_command.run(train_command.compose_config(args))
    assert len(calls) == 1 and calls[0].logged
    return run_dir, calls[0].kwargs["id"]


def test_the_rr_spectrum_goes_to_the_runs_wandb_run_as_its_own_curve(wandb_run, tmp_path, monkeypatch, capsys):
    run_dir, run_id = wandb_run
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    out = tmp_path / "rr"
    assert rr_main([f"run_dir={run_dir}", f"out={out}", "batch_size=256", "num_workers=0"]) == 0
    eigenvalues = json.loads((out / "manifest.json").read_text())["eigenvalues"]
    (run,) = calls
    assert run.kwargs["id"] == run_id and run.kwargs["resume"] == "allow" and run.kwargs["mode"] == "offline"
    (logged,) = run.logged
    curve = logged["rr/spectrum"]
    assert (curve["x"], curve["y"]) == ("feature", "eigenvalue") and "step 2" in curve["title"]
    assert [row[1] for row in curve["table"]["data"]] == pytest.approx(eigenvalues)
    assert [row[0] for row in curve["table"]["data"]] == list(range(1, len(eigenvalues) + 1))
    assert run.summary["rr/eigenvalue/001"] == pytest.approx(eigenvalues[0]) and run.summary["rr/step"] == 2
    assert not any(key.startswith("eigenvalue/") for key in logged)  # the training curves are not touched
    assert "logged to the run's wandb run" in capsys.readouterr().out


def test_a_wandb_failure_leaves_the_export_complete(wandb_run, tmp_path, monkeypatch, capsys):
    run_dir, _ = wandb_run
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb([], fail=True))
    out = tmp_path / "rr"
    assert rr_main([f"run_dir={run_dir}", f"out={out}", "batch_size=256", "num_workers=0"]) == 0
    assert (out / "manifest.json").is_file()
    assert "not logged to wandb (RuntimeError: no network); the export is complete" in capsys.readouterr().out


def test_a_run_with_wandb_disabled_logs_nothing(digits_root, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls))
    run_dir = tmp_path / "quiet"
    train_command.run(train_command.compose_config(overrides(run_dir, digits_root, "steps=2", "checkpoint_every=2")))
    assert rr_main([f"run_dir={run_dir}", "batch_size=256", "num_workers=0"]) == 0
    assert calls == []  # logging.wandb.mode=disabled in the run's config
