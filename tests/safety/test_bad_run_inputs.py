"""Bad-input cases on a run directory (docs/bad-input.md): eigtrain-rr and eigtrain-eval in this process on an
unfinished digits run (stopped at step 2 of 4, no final export). Each ends with one line naming the cause and the
file, or completes and says which step it used; nothing in a file is run, no finished work is lost."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from eigtrain.runs.checkpoint_verify import record_file

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory, digits_root):
    """A run stopped at step 2 of 4 (stop_after=2): checkpoints/step-2, no model.safetensors."""
    from eigtrain.train.command import main

    run_dir = tmp_path_factory.mktemp("runs") / "unfinished"
    argv = sys.argv
    sys.argv = [
        "eigtrain-train",
        "experiment=cpu_debug",
        f"run_dir={run_dir}",
        f"data.root={digits_root}",
        "steps=4",
        "stop_after=2",
        "checkpoint_every=2",
        "logging.wandb.mode=disabled",
        "logging.progress=false",
        "data.num_workers=0",
    ]
    try:
        main()
    finally:
        sys.argv = argv
    assert (run_dir / "checkpoints" / "step-2" / "COMPLETE").is_file() and not (run_dir / "model.safetensors").exists()
    return run_dir


@pytest.fixture
def run_copy(unfinished, tmp_path):
    return shutil.copytree(unfinished, tmp_path / "run")


def _command(main, argv) -> tuple[int, str]:
    """Exit code, and stderr (a failure's one line) or, on success, stdout."""
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue() if code else out.getvalue()


def rr(*argv):
    from eigtrain.export.command import main

    return _command(main, ["num_workers=0", "batch_size=64", *argv])


def evaluate(*argv):
    from eigtrain.evaluate.command import main

    return _command(main, ["probe=closed_form", "random_draws=0", "retrieval=none", *argv])


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err[-3000:]
    return lines[-1]


def test_rr_and_eval_of_an_unfinished_run_say_and_record_the_step(run_copy):
    said = rf"{re.escape(str(run_copy))} at step 2 of 4 \(checkpoint .*step-2; the run has not finished\)"
    code, out = rr(f"run_dir={run_copy}")
    assert code == 0 and re.search(rf"^eigtrain-rr: {said}$", out, re.M), out[-3000:]
    source = json.loads((run_copy / "rr" / "manifest.json").read_text())["source"]
    assert (source["step"], source["steps"]) == (2, 4)

    code, out = evaluate(f"run_dir={run_copy}", "dims=[2,4]")
    assert code == 0 and re.search(rf"^Weights: {said}\.$", out, re.M), out[-3000:]  # the table it prints
    report = json.loads((run_copy / "eval" / "report.json").read_text())
    assert [(w["step"], w["steps"]) for w in report["weights"]] == [(2, 4)]
    assert re.search(rf"^Weights: {said}\.$", (run_copy / "eval" / "table.md").read_text(), re.M)


def test_eval_with_fixed_feature_runs_at_none_of_the_dims_writes_its_report(run_copy, tmp_path):
    """ff_run_dirs of width 16 and dims=[4]: there is no FF cell to compare (it crashed with StopIteration after
    all its work and wrote nothing)."""
    code, err = evaluate(f"run_dir={run_copy}", f"ff_run_dirs=[{run_copy}]", "dims=[4]", f"out={tmp_path / 'ev'}")
    assert code == 0, err[-3000:]
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["accuracy"]["PCA"]["4"] > 0 and (tmp_path / "ev" / "table.md").is_file()


@pytest.mark.parametrize(
    "tag", ["!!python/object/apply:os.system ['touch {mark}']", "!!python/name:os.system", "!mine {{a: 1}}"]
)
@pytest.mark.parametrize("command", ["rr", "eval"])
def test_an_unsafe_yaml_tag_in_a_saved_config_is_one_line_and_never_runs(run_copy, tmp_path, tag, command):
    mark = tmp_path / "ran"
    config = run_copy / "config.yaml"
    config.write_text(config.read_text() + f"planted: {tag.format(mark=mark)}\n")
    record_file(run_copy, "config.yaml")  # whoever plants a tag can rewrite the recorded sha256 too
    code, err = rr(f"run_dir={run_copy}") if command == "rr" else evaluate(f"run_dir={run_copy}")
    assert code == 2 and not mark.exists()
    line = _one_line(err)
    assert re.fullmatch(rf"eigtrain-{command}: cannot read {re.escape(str(config))} \(line \d+\): .*tag.*", line), line


def _shard_with_a_latin1_key(path, prefix: str, n: int, bad: int):
    """A tar shard whose sample `bad` has a key that is not UTF-8 (tar member names are bytes: b'...\\xe9')."""
    import tarfile

    from tests.support.foreign_shards import good_samples

    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, sample in enumerate(good_samples(prefix, n)):
            key = sample["__key__"].encode() + (b"\xe9" if i == bad else b"")
            for ext in ("jpg", "cls"):
                data = sample[ext] if isinstance(sample[ext], bytes) else str(sample[ext]).encode()
                info = tarfile.TarInfo((key + b"." + ext.encode()).decode(errors="surrogateescape"))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_a_shard_key_that_is_not_utf8_is_read_as_its_bytes(tmp_path):
    """eigtrain-rr failed with "'utf-8' codec can't encode character '\\udce9'", naming no shard; a key is the tar's
    bytes, so its per-sample seed and half are those bytes' hash (the same on every rank and worker)."""
    from eigtrain.export.embed import key_folds, sample_generators

    for i in range(2):
        _shard_with_a_latin1_key(tmp_path / f"s-{i}.tar", f"k{i}", 6, bad=3)
    code, err = rr(
        "encoder=module:tests.safety.test_bad_input:tiny_encoder",
        f"data.shards={tmp_path}/s-{{0..1}}.tar",
        "data.image_size=8",
        "data.augment=cifar",
        "batch_size=4",
        f"out={tmp_path / 'rr'}",
    )
    assert code == 0, err[-3000:]
    assert json.loads((tmp_path / "rr" / "manifest.json").read_text())["n"] == 12
    key = b"k0-03\xe9".decode(errors="surrogateescape")
    assert sample_generators([key], 0)[0].initial_seed() != sample_generators(["k0-03"], 0)[0].initial_seed()
    assert key_folds([key], 8).shape == (1,)
