"""Resume checks that cannot be bypassed (issue 52): every checkpoint stores the run's identity, a keyed digest of
each lineage key's unredacted value (eigtrain.runs.lineage.identity). A dataset that differs only in a URL query
(both REDACTED in config.yaml) and a changed objective with config.yaml deleted are refused in one line naming the
key; new_lineage=true still continues (recorded)."""

from __future__ import annotations

import json

import pytest

from tests.safety import test_bad_input as bad_input
from tests.safety.test_bad_input import train_small

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning"),
]
world = bad_input.world


def test_a_query_that_redaction_hides_still_changes_the_lineage(world):
    run = world.tmp / "run"
    shards = world.server.url("good-{0..1}.tar")
    assert train_small(world, run, f"{shards}?set=a&token=secret-aaaa").code == 0
    identity = json.loads((run / "checkpoints" / "step-2" / "trainer.json").read_text())["identity"]
    assert identity["data.shards"] and "secret" not in json.dumps(identity)
    assert (run / ".eigtrain-key").stat().st_mode & 0o077 == 0
    outcome = train_small(world, run, f"{shards}?set=b&token=secret-aaaa")
    assert outcome.code != 0 and "data.shards" in outcome.message and "secret" not in outcome.message, outcome
    again = train_small(world, run, f"{shards}?set=b&token=secret-aaaa", "new_lineage=true")
    assert again.code == 0, again
    assert "data.shards" in (run / "lineage.jsonl").read_text()


def test_a_deleted_config_yaml_does_not_open_the_run_to_another_objective(world):
    run = world.tmp / "run"
    shards = bad_input.local(world, "good-{0..1}.tar")
    assert train_small(world, run, shards).code == 0
    (run / "config.yaml").unlink()
    outcome = train_small(world, run, shards, "objective=vicreg")
    assert outcome.code != 0 and "objective" in outcome.message and "\n" not in outcome.message, outcome
