"""eigtrain-train composes its config (Hydra), validates it once per launch and converts it once to its TrainConfig;
the components take their parts of that one object (none converts the config again)."""

import sys

import pytest
from omegaconf import OmegaConf

from eigtrain.train import checks as train_checks
from eigtrain.train import command as train
from tests.support.runs import overrides


def counted(monkeypatch, module, name: str) -> list:
    """The calls of `module.name` from outside OmegaConf (whose to_object calls itself for every nested node)."""
    calls: list = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        if not sys._getframe(1).f_globals.get("__name__", "").startswith("omegaconf"):
            calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def test_a_launch_validates_once_and_converts_its_config_once(digits_root, tmp_path, monkeypatch):
    validations = counted(monkeypatch, train, "validate")
    conversions = counted(monkeypatch, train, "train_config")
    to_object = counted(monkeypatch, OmegaConf, "to_object")  # every conversion of a config node to a dataclass
    argv = overrides(tmp_path / "run", digits_root, "steps=2", "checkpoint_every=2")
    monkeypatch.setattr(sys, "argv", ["eigtrain-train", *argv])
    train.main()
    assert (tmp_path / "run" / "model.safetensors").is_file()
    assert len(validations) == 1, "validate() runs once per launch (main's check of the command line)"
    # one conversion for the command line's check before Hydra runs, one in the job (its run and launcher take parts)
    assert len(conversions) == 2 and len(to_object) == 2


def test_an_in_process_run_validates_and_converts_once(digits_root, tmp_path, monkeypatch):
    conversions = counted(monkeypatch, train, "train_config")
    to_object = counted(monkeypatch, OmegaConf, "to_object")
    validations = counted(monkeypatch, train, "validate")
    cfg = train.compose_config(overrides(tmp_path / "run", digits_root, "steps=2", "checkpoint_every=2"))
    train.run(cfg)  # tools and tests call it without the command line's check: validated here, once
    assert len(validations) == 1 and len(conversions) == 1 and len(to_object) == 1
    assert train_checks.batch_split(cfg, 1) == (cfg.batch_size, 1)


def test_each_point_of_a_sweep_is_validated_once_and_converted_once_in_its_job(digits_root, tmp_path, monkeypatch):
    """-m seed=0,1: main() validates both points before Hydra runs them; no job validates again, and each job
    converts its own config once (its run and its launcher take parts of it)."""
    validations = counted(monkeypatch, train, "validate")
    conversions = counted(monkeypatch, train, "train_config")
    to_object = counted(monkeypatch, OmegaConf, "to_object")
    argv = overrides(tmp_path / "sweep", digits_root, "steps=2", "checkpoint_every=2", "seed=0,1")
    monkeypatch.setattr(sys, "argv", ["eigtrain-train", "-m", *argv])
    train.main()
    finished = sorted(p.parent.name for p in (tmp_path / "sweep").glob("*/model.safetensors"))
    assert len(finished) == 2 and "seed=0" in finished[0] and "seed=1" in finished[1], finished
    assert len(validations) == 2, "each point validated once, before Hydra ran it; not again in its job"
    assert len(conversions) == len(to_object) == 4, "per point: one conversion for its check, one in its job"


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("eigtrain.export.command", ["run_dir={missing}"]),
        ("eigtrain.evaluate.command", ["run_dir={missing}"]),
        ("eigtrain.export.corpus", ["run_dir={missing}", "out={missing}-out"]),
        ("eigtrain.export.standalone", ["run_dir={missing}", "format=onnx", "out={missing}.onnx"]),
    ],
)
def test_each_command_converts_its_command_line_once(module, argv, tmp_path, monkeypatch):
    """The small commands compose their dataclass once (eigtrain.cli.compose_dataclass) and hand it down: a run that
    fails on its first real work (a run directory that does not exist) has converted its config exactly once."""
    import importlib

    command = importlib.import_module(module)
    to_object = counted(monkeypatch, OmegaConf, "to_object")
    missing = str(tmp_path / "no-run")
    assert command.main([a.format(missing=missing) for a in argv]) != 0
    assert len(to_object) == 1
