"""data.val_shards: a run trained on data.shards is evaluated (eigtrain-eval), ordered on split=val (eigtrain-rr)
and monitored on held-out shards, never on its training shards; without them each refuses with one line naming
data.val_shards, and the report names the shards each split came from."""

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eigtrain.evaluate.command import main as eval_main
from eigtrain.export.command import main as rr_main
from eigtrain.runs.checkpoint_verify import record_file
from eigtrain.schema import ConfigError
from eigtrain.train.checks import validate
from tests.support.foreign_shards import N_TRAIN, N_VAL, TRAIN_PER_CLASS, VAL_PER_CLASS, train_overrides, write_shards

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """(train pattern, val pattern): disjoint images and keys, the same classes and fields."""
    directory = tmp_path_factory.mktemp("shards")
    return (
        write_shards(directory, "train", TRAIN_PER_CLASS, 0, TRAIN_PER_CLASS),
        write_shards(directory, "val", VAL_PER_CLASS, 1, 2 * VAL_PER_CLASS),
    )


@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory):
    """A 2-step run on the train shards with data.val_shards and the online monitor on."""
    from eigtrain.train.command import compose_config, run

    train, val = shards
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    cfg = compose_config(
        train_overrides(
            run_dir,
            train,
            "steps=2",
            "checkpoint_every=2",
            f"data.val_shards='{val}'",
            "monitor.every=2",
            "data.num_workers=1",
        )
    )
    assert run(cfg)["step"] == 2
    return run_dir


def without_val_shards(run_dir: Path, copy: Path) -> Path:
    """A copy of the run as one trained without data.val_shards (e.g. before the key existed) leaves it."""
    shutil.copytree(run_dir, copy)
    cfg = OmegaConf.load(copy / "config.yaml")
    del cfg.data["val_shards"]
    OmegaConf.save(cfg, copy / "config.yaml")
    record_file(copy, "config.yaml")  # as eigtrain would have recorded it then
    return copy


EVAL = ["probe=closed_form", "random_draws=2", "retrieval=torch", "retrieval_draws=1", "pca=false"]


def test_eval_scores_the_held_out_shards_and_names_both_sources(shards, trained, tmp_path):
    train, val = shards
    assert eval_main([f"run_dir={trained}", f"out={tmp_path / 'eval'}", *EVAL]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["retrieval_setup"]["database"] == N_TRAIN and report["retrieval_setup"]["queries"] == N_VAL
    assert report["data"] == {"train": f"data.shards={train}", "test": f"data.val_shards={val}"}
    table = (tmp_path / "eval" / "table.md").read_text()
    assert f"Data: fitted on data.shards={train}; scored on data.val_shards={val}." in table


def test_eval_without_val_shards_refuses_with_one_line_and_takes_them_from_the_command_line(
    shards, trained, tmp_path, capsys
):
    _, val = shards
    run_dir = without_val_shards(trained, tmp_path / "run")
    assert eval_main([f"run_dir={run_dir}", f"out={tmp_path / 'eval'}", *EVAL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.val_shards=" in err and "never scored as validation" in err
    assert not (tmp_path / "eval").exists()
    assert eval_main([f"run_dir={run_dir}", f"out={tmp_path / 'eval'}", f"data.val_shards={val}", *EVAL]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["data"]["test"] == f"data.val_shards={val}" and report["retrieval_setup"]["queries"] == N_VAL


def test_rr_split_val_reads_the_val_shards_and_refuses_without_them(shards, trained, tmp_path, capsys):
    _, val = shards
    assert rr_main([f"run_dir={trained}", "split=val", f"out={tmp_path / 'rr'}", "num_workers=1"]) == 0
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    assert manifest["n"] == N_VAL and manifest["source"]["split"] == "val"
    assert manifest["source"]["data"] == f"data.val_shards={val}"
    run_dir = without_val_shards(trained, tmp_path / "run")
    capsys.readouterr()
    assert rr_main([f"run_dir={run_dir}", "split=val", f"out={tmp_path / 'rr2'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.val_shards=" in err
    assert rr_main([f"run_dir={run_dir}", "split=test", f"out={tmp_path / 'rr2'}"]) == 2
    assert "split 'test' does not exist for data.shards" in capsys.readouterr().err
    assert not (tmp_path / "rr2").exists()


def test_monitor_scores_the_val_shards(trained):
    records = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    knn = {k: v for r in records for k, v in r.items() if k.startswith("knn/")}
    assert knn and all(0 <= v < 0.9 for v in knn.values())  # its own training images would score 1.0


def test_config_checks_name_data_val_shards(shards, tmp_path):
    from eigtrain.train.command import compose_config

    train, val = shards
    base = train_overrides(tmp_path / "run", train)
    with pytest.raises(ConfigError, match=r"data\.val_shards=PATTERN"):
        validate(compose_config([*base, "monitor.every=2"]), 1)
    one_train_shard = train.replace("{000000..000003}", "000002")
    with pytest.raises(ConfigError, match=r"data\.val_shards shares 1 shard\(s\) with data\.shards"):
        validate(compose_config([*base, f"data.val_shards=['{val}','{one_train_shard}']"]), 1)
    with pytest.raises(ConfigError, match="do not exist"):
        validate(compose_config([*base, f"data.val_shards='{val.replace('val-', 'nothing-')}'"]), 1)
    with pytest.raises(ConfigError, match="data.val_shards goes with data.shards"):
        validate(compose_config(["experiment=cpu_debug", f"run_dir={tmp_path / 'r'}", f"data.val_shards='{val}'"]), 1)
    validate(compose_config([*base, f"data.val_shards='{val}'", "monitor.every=2"]), 1)


def test_rr_of_any_encoder_reads_split_val_from_data_val_shards(shards, tmp_path, capsys):
    train, val = shards
    common = [
        "encoder=module:tests.export.test_rr_external:make_encoder",
        f"data.shards={train}",
        "data.augment=cifar",
        "data.image_size=16",
        "num_workers=0",
        "split=val",
    ]
    assert rr_main([*common, f"data.val_shards={val}", f"out={tmp_path / 'rr'}"]) == 0
    manifest = json.loads((tmp_path / "rr" / "manifest.json").read_text())
    assert manifest["n"] == N_VAL and manifest["source"]["data"]["val_shards"] == val
    capsys.readouterr()
    assert rr_main([*common, f"out={tmp_path / 'rr2'}"]) == 2
    assert "data.val_shards=" in capsys.readouterr().err
