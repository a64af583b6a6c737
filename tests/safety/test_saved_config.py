"""A run's saved config.yaml is data (issue 51 §2): no resolver is called, no alias expanded, no ??? accessed; each
refusal is one line naming the key; a config eigtrain wrote reads back unchanged."""

from __future__ import annotations

import time

import pytest
from omegaconf import OmegaConf

from eigtrain.runs.lineage import check_resume
from eigtrain.runs.saved_config import SavedConfigError, load_saved_config


def _saved(tmp_path, text: str):
    (tmp_path / "config.yaml").write_text(text)
    return tmp_path / "config.yaml"


@pytest.mark.parametrize(
    "value",
    [
        "${oc.env:AWS_SECRET_ACCESS_KEY}",  # the review's case: the secret went to the shard server in the URL
        "https://host/${oc.env:GITHUB_TOKEN}/train-{0..3}.tar",  # another key, inside a URL
        "${oc.decode:'!!python/object/apply:os.system [id]'}",  # another resolver
        "${eigtrain.sweep_point:x}",  # eigtrain's own resolver
    ],
)
def test_a_resolver_in_a_saved_value_is_refused_naming_the_key(tmp_path, monkeypatch, value):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "TOPSECRET")
    monkeypatch.setenv("GITHUB_TOKEN", "TOPSECRET")
    path = _saved(tmp_path, f"dim: 8\ndata:\n  shards: {value!r}\n")
    with pytest.raises(SavedConfigError, match=r"data\.shards calls a resolver") as refused:
        load_saved_config(path)
    assert "TOPSECRET" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_plain_dollar_brace_stays_literal_for_the_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/somewhere")
    path = _saved(tmp_path, "data:\n  shards: 'pipe:curl -H \"Authorization: Bearer ${HF_TOKEN}\" https://h/x.tar'\n")
    assert load_saved_config(path).data.shards == 'pipe:curl -H "Authorization: Bearer ${HF_TOKEN}" https://h/x.tar'
    path = _saved(tmp_path, "run_dir: ${HOME}/runs\n")
    assert load_saved_config(path).run_dir == "${HOME}/runs"  # not /somewhere/runs


def test_nested_aliases_are_refused_at_once(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]" for p, c in zip("abcdefgh", "bcdefghi")
    ]
    path = _saved(tmp_path, "\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(SavedConfigError, match=r"line 2\): a YAML alias \(\*a\)"):
        load_saved_config(path)
    assert time.perf_counter() - start < 1.0


def test_a_missing_value_is_one_line_naming_it(tmp_path):
    with pytest.raises(SavedConfigError, match=r"dim has no value \(\?\?\?\)"):
        load_saved_config(_saved(tmp_path, "dim: ???\nsteps: 3\n"))


def test_resume_reads_the_saved_config_as_data(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "TOPSECRET")
    _saved(tmp_path, "data:\n  shards: ${oc.env:AWS_SECRET_ACCESS_KEY}\n")
    refusal = check_resume(tmp_path, {"data": {"shards": "s3://b"}}, step=2, allow_new_lineage=False)
    assert "calls a resolver" in refusal and "TOPSECRET" not in refusal


def test_a_config_eigtrain_wrote_reads_back_unchanged(tmp_path):
    from eigtrain.redact import redact_config
    from eigtrain.train.command import compose_config

    composed = compose_config(["experiment=cpu_debug", "data.shards='pipe:cat \\${HOME}/x.tar'"])
    path = _saved(tmp_path, OmegaConf.to_yaml(redact_config(composed)))
    assert OmegaConf.to_container(load_saved_config(path), resolve=True) == redact_config(composed)
