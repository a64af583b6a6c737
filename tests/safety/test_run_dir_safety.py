"""A run directory from anyone: a pickle planted under any name eigtrain opens never runs, whatever command reads it.

Each case trains a 2-step run (checkpoints step-1, step-2), plants a pickle whose unpickling would create a marker
file under one file name in the run / step directory, and (the strongest case) rewrites the step's checksums so that
verification passes and the loader itself is what reads the file. Then eigtrain-rr run_dir=, eigtrain-rr
checkpoint=, eigtrain-eval run_dir= and a resumed eigtrain-train run: the marker never appears and each command ends
with one line (or completes, where the planted name is one it has no reason to open).
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path

import pytest

from eigtrain.runs.checkpoint import MARKER, OWNER
from eigtrain.runs.checkpoint_verify import write_checksums
from tests.safety import test_bad_input as bad_input
from tests.safety.test_bad_input import _last_line, _redirect_stderr, local, rr, train_small
from tests.support.fault_server import FaultServer
from tests.support.foreign_shards import good_samples, write_shard

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]


world = bad_input.world  # its world: two good shards, served too; the user's files checked unchanged


class Planted:
    """Unpickling it creates `path` (what any code run from a file could do)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


# What eigtrain may open in a step directory (DCP, DeepSpeed ZeRO 1-3, its own), and in a run directory.
STEP_NAMES = (
    ".metadata",
    "__0_0.distcp",
    "rank-0.pt",
    "mp_rank_00_model_states.pt",
    "zero_pp_rank_0_mp_rank_00_model_states.pt",
    "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "trainer.json",
    "checksums.json",
)
RUN_NAMES = ("model.safetensors", "model.json")


def plant(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps(Planted(marker)))


def eval_(world, *args: str):
    from eigtrain.evaluate.command import main

    stderr = io.StringIO()
    with _redirect_stderr(stderr):
        code = main(["probe=closed_form", "random_draws=2", "retrieval=none", "dims=[4]", *args])
    return code, _last_line(stderr.getvalue())


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, str]:
    """One trained 2-step run (and the shards pattern it trained on) that each case copies."""
    tmp = tmp_path_factory.mktemp("template")
    (tmp / "shards").mkdir()
    for i in range(2):
        write_shard(tmp / "shards" / f"good-{i}.tar", good_samples(f"g{i}", 6))
    with FaultServer(tmp / "shards") as server:
        world = bad_input.World(tmp, tmp / "shards", server)
        outcome = train_small(world, tmp / "run", local(world, "good-{0..1}.tar"), "dim=4")
    assert outcome.code == 0, outcome
    return tmp / "run", local(world, "good-{0..1}.tar")


def trained(world, template) -> Path:
    shutil.copytree(template[0], world.tmp / "run")
    return world.tmp / "run"


def commands(world, run: Path, shards: str) -> dict[str, tuple[int, str]]:
    step = run / "checkpoints" / "step-2"
    val = f"data.val_shards={world.shard('val-0.tar', good_samples('v0', 6))}"
    out = {
        "rr run_dir=": rr(world, f"run_dir={run}", f"out={world.tmp / 'rr-a'}"),
        "rr checkpoint=": rr(world, f"checkpoint={step}", f"out={world.tmp / 'rr-b'}"),
        "eval run_dir=": eval_(world, f"run_dir={run}", f"out={world.tmp / 'ev'}", val),
        "train resume": train_small(world, run, shards, "dim=4"),
    }
    return {k: (v.code, v.message) if hasattr(v, "code") else v for k, v in out.items()}


@pytest.mark.parametrize("name", STEP_NAMES + RUN_NAMES)
def test_a_planted_pickle_never_runs(world, template, name):
    run = trained(world, template)
    (run / "model.safetensors").rename(run / "final.bak")  # the commands read the checkpoints
    marker = world.tmp / "code-ran"
    step = run / "checkpoints" / "step-2"
    if name in RUN_NAMES:
        plant(run / name, marker)
    else:
        plant(step / name, marker)
        if name != "checksums.json":  # the loader, not the checksums, must be what refuses it
            write_checksums(step, skip=(OWNER, MARKER))
    results = commands(world, run, template[1])
    assert not marker.exists(), f"a planted pickle named {name} ran: {results}"
    for command, (code, message) in results.items():
        assert "Traceback" not in message and "\n" not in message.strip(), (command, message)
        assert code == 0 or message, (command, code)


def test_a_checkpoint_without_checksums_is_still_loaded_safely(world, template):
    """A checkpoint from before checksums (its marker announces none): nothing is verified, nothing runs."""
    run = trained(world, template)
    (run / "model.safetensors").unlink()
    marker, step = world.tmp / "code-ran", run / "checkpoints" / "step-2"
    (step / "checksums.json").unlink()
    (step / MARKER).write_text(json.dumps({"step": 2, "world_size": 1}))
    plant(step / ".metadata", marker)
    outcome = rr(world, f"checkpoint={step}")
    assert not marker.exists()
    assert outcome.code == 2 and "cannot read" in outcome.message and ".metadata" in outcome.message, outcome


def test_export_dir_planted_pickles_never_run(world, template):
    run = trained(world, template)
    assert rr(world, f"run_dir={run}", f"out={run / 'rr'}").code == 0
    marker = world.tmp / "code-ran"
    shutil.copytree(run / "rr", world.tmp / "rr-copy")
    plant(world.tmp / "rr-copy" / "rr.safetensors", marker)
    val = world.shard("val-0.tar", good_samples("v0", 6))
    code, message = eval_(
        world, f"run_dir={run}", f"rr={world.tmp / 'rr-copy'}", f"out={world.tmp / 'ev'}", f"data.val_shards={val}"
    )
    assert not marker.exists() and code == 2 and "\n" not in message.strip(), message


def test_rr_reads_a_step_the_trainer_prunes_meanwhile(world, template, monkeypatch, caplog):
    """keep-k pruning while eigtrain-rr reads a step: the step is kept until the read ends, and rr completes."""
    from eigtrain.runs import checkpoint as ckpt

    run = trained(world, template)
    read = ckpt.load_encoder

    def prune_meanwhile(run_dir, step):
        assert ckpt.prune(run / "checkpoints", keep_last=1) == []  # the trainer's keep_last=1 after step 2
        return read(run_dir, step)

    monkeypatch.setattr(ckpt, "load_encoder", prune_meanwhile)
    outcome = rr(world, f"checkpoint={run / 'checkpoints' / 'step-1'}")
    assert outcome.code == 0, outcome
    assert "step-1 is being read" in caplog.text
    assert [p.name for p in ckpt.prune(run / "checkpoints", keep_last=1)] == ["step-1"]  # read over: pruned


def test_a_step_pruned_between_its_choice_and_its_read_is_chosen_again(world, template, monkeypatch, caplog):
    """issue 52: a live trainer (keep_last=1, a save every step) prunes the newest step after eigtrain-rr chose it and
    before it pinned it: rr takes the newest step again instead of failing ("pruned ... run again")."""
    import logging

    from eigtrain.export import run_weights

    run = trained(world, template)
    (run / "model.safetensors").unlink()  # a run still training: its checkpoints are what rr reads
    read, calls = run_weights.read_encoder, []

    def pruned_first(run_dir, step):
        calls.append(step.name)
        if len(calls) == 1:
            shutil.rmtree(step)  # the trainer's pruning, between the choice and the pin
        return read(run_dir, step)

    monkeypatch.setattr(run_weights, "read_encoder", pruned_first)
    with caplog.at_level(logging.INFO):
        outcome = rr(world, f"run_dir={run}", f"out={world.tmp / 'rr'}")
    assert outcome.code == 0, outcome
    assert calls == ["step-2", "step-1"] and "pruned while being chosen" in caplog.text


def test_eval_uses_another_steps_export_only_when_allowed_and_says_so(world, template):
    run = trained(world, template)
    step_1 = run / "checkpoints" / "step-1"
    assert rr(world, f"checkpoint={step_1}", f"out={world.tmp / 'rr-1'}").code == 0
    assert rr(world, f"run_dir={run}", f"out={run / 'rr'}").code == 0  # the run's own (its final weights)
    val = f"data.val_shards={world.shard('val-0.tar', good_samples('v0', 6))}"
    assert eval_(world, f"run_dir={run}", f"out={world.tmp / 'own'}", val)[0] == 0
    own = json.loads((world.tmp / "own" / "report.json").read_text())["rr_export"]
    assert own["same_weights"] and own["scored_weights"] == str(run / "model.safetensors")
    code, message = eval_(world, f"run_dir={run}", f"rr={world.tmp / 'rr-1'}", f"out={world.tmp / 'ev'}", val)
    assert code == 2 and "solved on other weights" in message and not (world.tmp / "ev").exists(), message
    args = (f"run_dir={run}", f"rr={world.tmp / 'rr-1'}", f"out={world.tmp / 'ev'}", val, "allow_foreign_export=true")
    assert eval_(world, *args)[0] == 0
    foreign = json.loads((world.tmp / "ev" / "report.json").read_text())["rr_export"]
    assert not foreign["same_weights"] and foreign["allow_foreign_export"] and foreign["solved_on"] == str(step_1)
    assert "solved on OTHER weights" in (world.tmp / "ev" / "table.md").read_text()
