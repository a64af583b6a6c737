"""`-h` / `--help` on every command (issue 55: only eval and embed had it): its usage, exit status 0, nothing run.
The commands are the installed package's console scripts, so a new one is covered the day it is added."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import pytest

SCRIPTS = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("eigtrain-")}


@pytest.mark.parametrize("name", sorted(n for n in SCRIPTS if n != "eigtrain-train"))  # (Hydra's: below)
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_every_command_prints_its_usage_on_help(name, flag, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written: the directory stays empty
    module, _, function = SCRIPTS[name].partition(":")
    code = getattr(importlib.import_module(module), function)([flag])
    out = capsys.readouterr().out
    assert code in (0, None) and out.startswith(name) and list(tmp_path.iterdir()) == [], out[:200]


def test_the_trainer_prints_hydras_help(capsys, monkeypatch, tmp_path):
    import sys

    from eigtrain.train.command import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["eigtrain-train", "-h"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code in (0, None) and "Configuration groups" in capsys.readouterr().out


def test_every_command_is_found():
    assert {"eigtrain-train", "eigtrain-rr", "eigtrain-eval", "eigtrain-embed", "eigtrain-export"} <= set(SCRIPTS)
