"""Every weights file eigtrain reads is the one it wrote (issue 52): model.safetensors and rr.safetensors are
hashed when written and verified before use. A bit flipped in the final weights: the commands use the newest
checkpoint that verifies, with one warning naming the file; another run's rr.safetensors swapped into an export:
one line; a COMPLETE marker whose `checksums` is not a file name: that step is skipped, never a traceback."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from eigtrain.runs.checkpoint import MARKER
from tests.safety import test_bad_input as bad_input
from tests.safety.test_run_dir_safety import eval_, rr, template, trained  # noqa: F401  (template: a fixture)
from tests.support.foreign_shards import good_samples

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]
world = bad_input.world


def _flip_a_bit(path, at: int = -9) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_changed_final_weights_are_never_used(world, template, caplog):  # noqa: F811
    run = trained(world, template)
    assert json.loads((run / "checksums.json").read_text())["files"]["model.safetensors"]
    _flip_a_bit(run / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        outcome = rr(world, f"run_dir={run}", f"out={world.tmp / 'rr'}")
    assert outcome.code == 0, outcome
    assert "model.safetensors does not match the sha256 recorded" in caplog.text
    source = json.loads((world.tmp / "rr" / "manifest.json").read_text())["source"]
    assert "step-2" in json.dumps(source) and "model.safetensors" not in source.get("path", "")
    shutil.rmtree(run / "checkpoints")  # nothing to fall back on: one line
    outcome = rr(world, f"run_dir={run}", f"out={world.tmp / 'rr2'}")
    assert outcome.code == 2 and "does not match the sha256" in outcome.message and "\n" not in outcome.message


def test_an_export_whose_tensors_were_swapped_is_refused(world, template):  # noqa: F811
    run = trained(world, template)
    assert rr(world, f"run_dir={run}", f"out={run / 'rr'}").code == 0
    assert rr(world, f"run_dir={run}", f"out={world.tmp / 'other'}", "trivial=keep").code == 0
    shutil.copy(world.tmp / "other" / "rr.safetensors", run / "rr" / "rr.safetensors")  # the manifest kept
    val = world.shard("val-0.tar", good_samples("v0", 6))
    code, message = eval_(world, f"run_dir={run}", f"out={world.tmp / 'ev'}", f"data.val_shards={val}")
    assert code == 2 and "rr.safetensors does not match the sha256 its manifest.json recorded" in message, message


@pytest.mark.parametrize("checksums", [5, [1], "../escape.json"])
def test_a_marker_naming_no_checksum_file_skips_the_step(world, template, checksums, caplog):  # noqa: F811
    run = trained(world, template)
    (run / "model.safetensors").unlink()
    marker = run / "checkpoints" / "step-2" / MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "checksums": checksums}))
    with caplog.at_level(logging.WARNING):
        outcome = rr(world, f"run_dir={run}", f"out={world.tmp / 'rr'}")
    assert outcome.code == 0 and "Traceback" not in outcome.message, outcome  # step-1 verifies
    assert "skipping checkpoint" in caplog.text and "step-2" in caplog.text


def test_a_changed_config_yaml_is_refused_naming_it(world, template):  # noqa: F811
    """config.yaml is recorded in checksums.json when written; one cut short or edited (here: another width, which
    eigtrain-rr would have built an encoder for) is refused by every reader in one line naming it."""
    run = trained(world, template)
    assert json.loads((run / "checksums.json").read_text())["files"]["config.yaml"]
    saved = (run / "config.yaml").read_text()
    assert "\ndim: " in saved
    for changed in (saved.replace("\ndim: ", "\ndim: 1"), saved[:1024]):
        (run / "config.yaml").write_text(changed)
        outcome = rr(world, f"run_dir={run}", f"out={world.tmp / 'rr'}")
        assert outcome.code == 2 and "\n" not in outcome.message, outcome
        assert "config.yaml does not match the sha256 recorded" in outcome.message, outcome
    (run / "config.yaml").write_text(saved)
    assert rr(world, f"run_dir={run}", f"out={world.tmp / 'rr'}").code == 0
