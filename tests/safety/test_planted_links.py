"""No write through a planted symbolic link (issue 51 §3): every file eigtrain writes goes through eigtrain.safe_files
(a fresh temporary beside it, renamed over the name; files kept open are opened with O_NOFOLLOW). A link planted
under any of those names, pointing at a victim file, is replaced by eigtrain's file or refused in one line naming
it; the victim is never written. Values from someone's config reach a report as one line (no raw newlines)."""

from __future__ import annotations

import io
import json

import pytest

from eigtrain.evaluate.report import write_report
from eigtrain.runs.output_dirs import RUN_MARK
from tests.safety import test_bad_input as bad_input
from tests.safety.test_bad_input import _last_line, _redirect_stderr, local, rr, train_small
from tests.support.foreign_shards import good_samples

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]

world = bad_input.world
VICTIM_TEXT = b"the victim's own bytes\n"
# What the trainer writes in a run directory by name, replaced whole (the metrics log is kept open: a link there is
# refused, below; the lock is on the directory, .eigtrain-lock only names its holder).
REPLACED = (
    "config.yaml",
    "model.json",
    "environment.json",
    "wandb_id",
    "model.safetensors",
    RUN_MARK,
    ".eigtrain-lock",
)


def _plant(directory, names, victims):
    directory.mkdir(parents=True, exist_ok=True)
    links = {}
    for name in names:
        victim = victims / f"victim-{name.strip('.')}"
        victim.write_bytes(VICTIM_TEXT)
        (directory / name).symlink_to(victim)
        links[name] = victim
    return links


def _untouched(links):
    for name, victim in links.items():
        assert victim.read_bytes() == VICTIM_TEXT, f"written through the link {name}"


def test_the_trainer_replaces_links_planted_under_its_file_names(world):
    run_dir = world.tmp / "run"
    links = _plant(run_dir, REPLACED, world.tmp)
    outcome = train_small(world, run_dir, local(world, "good-{0..1}.tar"))
    assert outcome.code == 0, outcome.message
    _untouched(links)
    for name in REPLACED:
        assert (run_dir / name).is_file() and not (run_dir / name).is_symlink(), name


@pytest.mark.parametrize("name", ["metrics.jsonl"])
def test_a_link_at_a_file_the_trainer_keeps_open_is_refused_in_one_line(world, name):
    run_dir = world.tmp / "run"
    links = _plant(run_dir, [name], world.tmp)
    outcome = train_small(world, run_dir, local(world, "good-{0..1}.tar"))
    assert outcome.code != 0 and name in outcome.message and "symbolic link" in outcome.message, outcome.message
    _untouched(links)


def test_eval_and_embed_replace_links_planted_in_their_outputs(world):
    from eigtrain.evaluate.command import main as eval_main
    from eigtrain.export.corpus import main as embed_main

    run_dir = world.tmp / "run"
    assert train_small(world, run_dir, local(world, "good-{0..1}.tar"), "dim=4").code == 0
    assert rr(world, f"run_dir={run_dir}").code == 0
    report = ("table.md", "table.csv", "report.json", "accuracy_vs_dim.png", "retrieval_vs_dim.png")
    links = _plant(run_dir / "eval", report, world.tmp)
    args = ["probe=closed_form", "random_draws=2", "retrieval=torch", "retrieval_draws=1", "dims=[4]"]
    with _redirect_stderr(io.StringIO()):
        code = eval_main(
            [f"run_dir={run_dir}", f"data.val_shards={world.shard('val-0.tar', good_samples('v0', 6))}", *args]
        )
    assert code == 0
    _untouched(links)
    assert all((run_dir / "eval" / name).is_file() and not (run_dir / "eval" / name).is_symlink() for name in report)
    embed_out = world.tmp / "embeddings"  # a link where the manifest goes: read as a foreign manifest, never written
    links = _plant(embed_out, ["manifest.json"], world.tmp)
    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = embed_main([f"run_dir={run_dir}", f"out={embed_out}", "num_workers=0"])
    _untouched(links)
    assert code == 0 or "manifest.json" in _last_line(stderr.getvalue()), _last_line(stderr.getvalue())


def test_report_lines_hold_values_from_configs_as_data(tmp_path):
    """data.root (or a run directory's name) with a newline cannot start a line of its own in table.md."""
    injected = "/data\nrm -rf ~ #"
    report = {
        "dims": [4],
        "probe": "closed_form",
        "accuracy": {"RR": {4: 0.5}},
        "ordering": {},
        "knn": {},
        "data": {"train": f"{injected}: train", "test": f"{injected}: val"},
        "weights": [{"run_dir": injected, "weights": "model.safetensors", "step": 2, "steps": 2}],
    }
    paths = write_report(report, tmp_path / "eval", name=injected)
    text = paths["markdown"].read_text()
    assert not any(line.startswith("rm -rf") for line in text.splitlines())
    assert "/data\\nrm -rf ~ #" in text  # shown, escaped
    assert json.loads(paths["json"].read_text())["data"]["train"] == f"{injected}: train"  # the data kept as it is
