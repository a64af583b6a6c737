"""A run saved before a setting existed resumes under today's code when the setting is at the value that does what
the code did then (eigtrain.runs.lineage.SINCE_ADDED: model.pool = 1, the global pool); another value is a change.
Both checks agree: config.yaml's comparison and the checkpoint's keyed identity."""

from __future__ import annotations

from omegaconf import OmegaConf

from eigtrain.runs.lineage import changes, identity
from eigtrain.train.command import compose_config

KEY = b"k" * 32


def _before_pool(cfg):
    """The config as a run saved it before model.pool existed."""
    old = OmegaConf.to_container(cfg, resolve=True)
    del old["model"]["pool"]
    return OmegaConf.create(old)


def test_an_older_runs_model_is_the_same_lineage_at_the_global_pool():
    now = compose_config(["experiment=quickstart"])
    saved = _before_pool(now)
    assert now.model.pool == 1 and changes(saved, now) == {}
    assert identity(saved, KEY) == identity(now, KEY)


def test_a_grid_pool_on_an_older_run_is_a_change_of_model():
    saved = _before_pool(compose_config(["experiment=quickstart"]))
    now = compose_config(["experiment=quickstart", "model.pool=2"])
    assert set(changes(saved, now)) == {"model"}
    assert identity(saved, KEY)["model"] != identity(now, KEY)["model"]
