"""eigtrain never deletes or overwrites what it did not write: eigtrain-rr out=, checkpoint pruning, run
directories, eigtrain-shards out= (and its index out=), evaluation reports and the shard-count cache."""

import hashlib
import io
import json
import tarfile

import numpy as np
import pytest

from eigtrain.data.sample_counts import shard_counts
from eigtrain.data.write import main as shards_main
from eigtrain.evaluate.report import write_report
from eigtrain.export.command import main as rr_main
from eigtrain.export.files import EXPORT_FORMAT
from eigtrain.runs import checkpoint as ckpt
from eigtrain.runs.output_dirs import RUN_MARK, claim_run_dir
from eigtrain.schema import TrainConfig


def tree(root):
    """{relative path: content hash} of every file under root, plus the directories (a snapshot to compare)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


def fake_run_dir(root):
    """What a trained run looks like on disk: records, metrics, a complete checkpoint."""
    (root / "checkpoints" / "step-2").mkdir(parents=True)
    (root / "checkpoints" / "step-2" / "rank-0.pt").write_bytes(b"weights")
    ckpt.mark_complete(root / "checkpoints" / "step-2", {"step": 2, "world_size": 1})
    (root / "config.yaml").write_text("steps: 2\n")
    (root / "metrics.jsonl").write_text('{"step": 1}\n')
    return root


def embeddings(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(400, 4))
    np.savez(tmp_path / "emb.npz", z1=z, z2=z + 0.1 * rng.normal(size=z.shape))
    return tmp_path / "emb.npz"


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err


# --------------------------------------------------------------------------------------- eigtrain-rr out=


@pytest.mark.parametrize("overwrite", [[], ["overwrite=true"]])
def test_rr_refuses_an_out_that_is_a_run_directory_and_leaves_it_untouched(tmp_path, capsys, overwrite):
    run_dir = fake_run_dir(tmp_path / "run")
    before = tree(run_dir)
    assert rr_main([f"embeddings={embeddings(tmp_path)}", f"out={run_dir}", *overwrite]) == 2
    one_line_error(capsys, f"out={run_dir}", "not an eigtrain-rr export")
    assert tree(run_dir) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz", "run"]  # no staging or .old left beside it


def test_rr_replaces_an_earlier_export_only_with_overwrite_and_never_one_holding_user_files(tmp_path, capsys):
    emb, out = embeddings(tmp_path), tmp_path / "rr"
    out.mkdir()  # an empty directory is free
    assert rr_main([f"embeddings={emb}", f"out={out}"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == EXPORT_FORMAT
    before = tree(out)
    assert rr_main([f"embeddings={emb}", f"out={out}", "center=true"]) == 2
    one_line_error(capsys, "already holds an eigtrain-rr export", "overwrite=true")
    assert tree(out) == before
    assert rr_main([f"embeddings={emb}", f"out={out}", "center=true", "overwrite=true"]) == 0
    assert json.loads((out / "manifest.json").read_text())["source"]["center"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["emb.npz", "rr"]  # the old export is gone, nothing else
    (out / "notes.txt").write_text("mine")  # the user's own file in the export directory
    assert rr_main([f"embeddings={emb}", f"out={out}", "overwrite=true"]) == 2
    one_line_error(capsys, "not an eigtrain-rr export")
    assert (out / "notes.txt").read_text() == "mine"


def test_rr_refuses_an_out_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "results.csv"
    target.write_text("a,b\n")
    assert rr_main([f"embeddings={embeddings(tmp_path)}", f"out={target}", "overwrite=true"]) == 2
    one_line_error(capsys, "not an eigtrain-rr export")
    assert target.read_text() == "a,b\n"


# ------------------------------------------------------------------------------------------ checkpoints


class FileEngine:
    """The smallest engine: writes one file (the checkpointer, not the engine, is under test)."""

    def save(self, path, client_state):
        (path / "model.bin").write_bytes(b"m")


def test_pruning_deletes_only_step_directories_eigtrain_wrote(tmp_path):
    root = tmp_path / "checkpoints"
    (root / "step-1").mkdir(parents=True)  # the user's, named like a checkpoint, without eigtrain's files
    (root / "step-1" / "keep.txt").write_text("mine")
    (root / "notes").mkdir()
    saver = ckpt.Checkpointer(root, FileEngine(), TrainConfig(keep_last=1))
    for step in (2, 3, 4):
        saver.save(step, {"step": step}, {"data": {}})
    assert sorted(p.name for p in root.iterdir()) == ["notes", "step-1", "step-4"]
    assert ckpt.remove_incomplete(root) == [] and (root / "step-1" / "keep.txt").read_text() == "mine"
    (root / "step-5").mkdir()  # a foreign directory where the next save would go: refused, left as it is
    (root / "step-5" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not written by eigtrain"):
        saver.save(5, {"step": 5}, {"data": {}})
    assert [p.name for p in (root / "step-5").iterdir()] == ["keep.txt"]


def test_a_stale_partial_save_of_eigtrain_is_still_cleaned_up(tmp_path):
    root = tmp_path / "checkpoints"
    saver = ckpt.Checkpointer(root, FileEngine(), TrainConfig(keep_last=2))
    saver.save(2, {"step": 2}, {"data": {}})
    (root / "step-2" / ckpt.MARKER).unlink()  # as if killed before its marker
    assert ckpt.remove_incomplete(root) == [root / "step-2"] and not (root / "step-2").exists()


# ------------------------------------------------------------------------------------------- run_dir


def test_training_refuses_a_run_dir_holding_user_files(tmp_path):
    from eigtrain.schema import ConfigError
    from eigtrain.train.command import compose_config, run

    run_dir = tmp_path / "thesis"
    run_dir.mkdir()
    (run_dir / "chapter1.tex").write_text("mine")
    (run_dir / "metrics.jsonl").write_text("my own metrics\n")  # a name the trainer writes (and truncates)
    before = tree(run_dir)
    cfg = compose_config(
        [
            "experiment=cpu_debug",
            f"run_dir={run_dir}",
            f"data.root={tmp_path / 'digits'}",
            "steps=1",
            "logging.wandb.mode=disabled",
            "logging.progress=false",
        ]
    )
    with pytest.raises(ConfigError, match=r"run_dir=.*chapter1.tex.*choose a new or empty directory"):
        run(cfg)
    assert tree(run_dir) == before and not (tmp_path / "digits").exists()  # refused before any work


def test_run_dir_claim_accepts_new_empty_marked_and_earlier_run_directories(tmp_path):
    assert claim_run_dir(tmp_path / "new") == "" and (tmp_path / "new" / RUN_MARK).is_file()
    (tmp_path / "empty").mkdir()
    assert claim_run_dir(tmp_path / "empty") == ""
    earlier = fake_run_dir(tmp_path / "earlier")  # written before the mark existed: eigtrain's names only
    assert claim_run_dir(earlier) == "" and (earlier / RUN_MARK).is_file()
    (earlier / "my_notes.txt").write_text("added after the run")  # once marked, the user may add files
    assert claim_run_dir(earlier) == ""


# ------------------------------------------------------------------------------------ eigtrain-shards out=


def npz(tmp_path, n=10):
    np.savez(tmp_path / "a.npz", x=np.zeros((n, 4, 4), np.uint8))
    return ["source=npz", f"path={tmp_path / 'a.npz'}", "val_fraction=0"]


def test_shards_refuse_a_non_empty_directory_that_is_not_their_output(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "train-000000.tar").write_bytes(b"the user's own shard")  # the very name eigtrain would write
    before = tree(out)
    for extra in ([], ["overwrite=true"]):
        with pytest.raises(SystemExit, match="no index.json"):
            shards_main([*npz(tmp_path), f"out={out}", "shard_size=3", *extra])
        assert tree(out) == before


def test_shards_overwrite_deletes_only_shards_of_the_index_inside_out(tmp_path):
    args = [*npz(tmp_path), f"out={tmp_path / 'd'}"]
    shards_main([*args, "shard_size=3"])
    victim = tmp_path / "victim-000000.tar"
    victim.write_bytes(b"not eigtrain's")
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    index["train"]["../victim-000000.tar"] = 1  # an edited (or hostile) index naming a file outside out
    (tmp_path / "d" / "index.json").write_text(json.dumps(index))
    (tmp_path / "d" / "val-000000.tar").write_bytes(b"the user's, not in the index")
    with pytest.raises(SystemExit, match="val-000000.tar exists and is not listed"):
        shards_main([*npz(tmp_path), f"out={tmp_path / 'd'}", "shard_size=20", "overwrite=true", "val_fraction=0.2"])
    assert victim.read_bytes() == b"not eigtrain's"
    assert (tmp_path / "d" / "val-000000.tar").read_bytes() == b"the user's, not in the index"


def test_shard_index_refuses_to_replace_a_file_that_is_not_an_index(tmp_path, capsys):
    shards_main([*npz(tmp_path), f"out={tmp_path / 'd'}", "shard_size=5"])
    target = tmp_path / "paper.json"
    target.write_text('{"title": "mine"}')
    with pytest.raises(SystemExit, match="not a wids shard index"):
        shards_main(["index", f"{tmp_path / 'd'}/train-{{000000..000001}}.tar", f"out={target}"])
    assert target.read_text() == '{"title": "mine"}'
    shards_main(["index", f"{tmp_path / 'd'}/train-{{000000..000001}}.tar", f"out={tmp_path / 'i.json'}"])
    shards_main(["index", f"{tmp_path / 'd'}/train-{{000000..000001}}.tar", f"out={tmp_path / 'i.json'}"])  # redo


# --------------------------------------------------------------------------------- eval report, count cache


def test_eval_report_refuses_a_directory_holding_user_files(tmp_path):
    (tmp_path / "paper.pdf").write_bytes(b"%PDF")
    with pytest.raises(ValueError, match=r"out=.*paper.pdf.*refusing"):
        write_report({}, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["paper.pdf"]


def test_count_cache_writes_only_its_own_file(tmp_path):
    shard = tmp_path / "foreign-0.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"s{i}.cls")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "mine.json").write_text("{}")
    assert shard_counts([str(shard)], cache_dir=cache_dir) == [3]
    names = sorted(p.name for p in cache_dir.iterdir())
    assert len(names) == 2 and names[0] == "mine.json" and names[1].startswith("shard-counts-")
    assert (cache_dir / "mine.json").read_text() == "{}"


def test_a_slurm_log_folder_inside_the_run_dir_is_eigtrains(tmp_path):
    (tmp_path / "run" / "logs").mkdir(parents=True)  # launcher.folder=${run_dir}/logs, made before the job ran
    assert claim_run_dir(tmp_path / "run", str(tmp_path / "run" / "logs")) == ""
    (tmp_path / "other" / "logs").mkdir(parents=True)
    assert "logs" in claim_run_dir(tmp_path / "other")  # without that launcher folder: not eigtrain's


def test_eval_refuses_a_foreign_out_before_any_work(tmp_path, capsys):
    from eigtrain.evaluate.command import main as eval_main

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "paper.pdf").write_bytes(b"%PDF")
    # the features file does not even exist: the refusal comes first, before anything is read or computed
    assert eval_main([f"features={tmp_path / 'missing.npz'}", f"out={tmp_path / 'out'}"]) == 2
    one_line_error(capsys, "paper.pdf", "refusing")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["paper.pdf"]
