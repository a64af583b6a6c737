"""`pipe:` runs a shell command: one read back from a run's saved config.yaml (eigtrain-eval, eigtrain-rr,
embedding export) never runs unless the command line names it or passes data.allow_pipe=true; the refusal is one
line naming the key and how to allow it."""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eigtrain.data.pipe_trust import PipeNotAllowed, check_saved_sources, runs_command
from eigtrain.evaluate.command import main as eval_main
from eigtrain.export.command import main as rr_main
from eigtrain.export.embed import embed_split, open_run
from eigtrain.runs.checkpoint_verify import record_file
from tests.support.foreign_shards import N_TRAIN, TRAIN_PER_CLASS, VAL_PER_CLASS, train_overrides, write_shards

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run dir, train pattern, val pattern) of a 1-step run on local shards."""
    from eigtrain.train.command import compose_config, run

    directory = tmp_path_factory.mktemp("shards")
    train = write_shards(directory, "train", TRAIN_PER_CLASS, 0, TRAIN_PER_CLASS)
    val = write_shards(directory, "val", VAL_PER_CLASS, 1, 2 * VAL_PER_CLASS)
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    assert (
        run(compose_config(train_overrides(run_dir, train, "steps=1", "checkpoint_every=1", "data.num_workers=1")))[
            "step"
        ]
        == 1
    )
    return run_dir, train, val


def pipe(marker: Path, pattern: str) -> str:
    return f"pipe:touch {marker}; cat {pattern}"


def saved_with(run_dir: Path, **data) -> Path:
    """The run's config.yaml with data keys replaced, as a tampered or shared run directory would hold."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    cfg.data.update(data)
    OmegaConf.save(cfg, run_dir / "config.yaml")
    record_file(run_dir, "config.yaml")  # whoever can rewrite config.yaml can rewrite its recorded sha256 too
    return run_dir


@pytest.fixture
def tampered(trained, tmp_path):
    """(run dir whose saved data.shards is a pipe: that touches `marker`, marker, train pattern, val pattern)."""
    import shutil

    run_dir, train, val = trained
    copy, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(run_dir, copy)
    return saved_with(copy, shards=pipe(marker, train), val_shards=val), marker, train, val


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_saved_pipe_does_not_run_in_eval_rr_or_embedding_export(tampered, tmp_path, capsys):
    run_dir, marker, _, _ = tampered
    assert eval_main([f"run_dir={run_dir}", "probe=closed_form", "retrieval=none", f"out={tmp_path / 'eval'}"]) == 2
    err = one_line(capsys)
    assert "data.shards in" in err and "runs a shell command" in err and "data.allow_pipe=true" in err
    assert rr_main([f"run_dir={run_dir}", f"out={tmp_path / 'rr'}"]) == 2
    assert "data.shards in" in one_line(capsys)
    with pytest.raises(PipeNotAllowed, match="data.shards"):
        embed_split(open_run(run_dir), "train")
    saved_with(run_dir, allow_pipe=True)  # a saved allow_pipe is no permission: the command line decides
    assert rr_main([f"run_dir={run_dir}", f"out={tmp_path / 'rr'}"]) == 2
    assert not marker.exists() and not (tmp_path / "rr").exists() and not (tmp_path / "eval").exists()


def test_saved_pipe_runs_when_the_command_line_allows_or_names_it(tampered, tmp_path):
    run_dir, marker, train, _ = tampered
    assert rr_main([f"run_dir={run_dir}", "data.allow_pipe=true", f"out={tmp_path / 'rr'}", "num_workers=1"]) == 0
    assert marker.exists() and json.loads((tmp_path / "rr" / "manifest.json").read_text())["n"] == N_TRAIN
    marker.unlink()
    named = pipe(marker, train)
    assert rr_main([f"run_dir={run_dir}", f"data.shards={named}", f"out={tmp_path / 'rr2'}", "num_workers=1"]) == 0
    assert marker.exists()


def test_a_saved_val_pipe_is_refused_only_where_it_would_be_read(trained, tmp_path, capsys):
    import shutil

    run_dir, train, val = trained
    marker = tmp_path / "marker"
    shutil.copytree(run_dir, tmp_path / "run")
    saved = saved_with(tmp_path / "run", val_shards=pipe(marker, val))
    assert rr_main([f"run_dir={saved}", "split=val", f"out={tmp_path / 'rr'}"]) == 2
    assert "data.val_shards in" in one_line(capsys)
    assert rr_main([f"run_dir={saved}", f"out={tmp_path / 'rr'}", "num_workers=1"]) == 0  # train: local shards
    saved_with(saved, shard_index=pipe(marker, "index.json"))  # the count index is opened as a URL too
    assert rr_main([f"run_dir={saved}", f"out={tmp_path / 'rr2'}"]) == 2
    assert "data.shard_index in" in one_line(capsys)
    assert not marker.exists()


def test_every_spelling_of_a_pipe_is_caught():
    for url in ("pipe:cat a.tar", "PIPE:cat a.tar", " pipe:cat a.tar"):
        assert runs_command(url)
    assert not any(map(runs_command, ("a.tar", "file:a.tar", "https://h/a.tar", "s3://b/a.tar")))
    for value in ("{a.tar,pipe:cat b.tar}", ["a.tar", "Pipe:cat b.tar"]):
        with pytest.raises(PipeNotAllowed, match=r"data\.shards in c\.yaml .* data\.allow_pipe=true"):
            check_saved_sources({"shards": value}, ["shards"], (), False, Path("c.yaml"))
    check_saved_sources({"shards": "pipe:cat b.tar"}, ["shards"], ("shards",), False, Path("c.yaml"))
    check_saved_sources({"shards": "pipe:cat b.tar"}, ["shards"], (), True, Path("c.yaml"))
