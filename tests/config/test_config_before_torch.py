"""Issue 53: every console script answers -h and refuses a bad key or value before torch is imported (the import
is observable: `torch` in sys.modules of a fresh interpreter), so a typo costs a fraction of a second, not the seconds
torch, torchvision and DeepSpeed take; a good command line still reaches the command. The time itself is measured by
`python tools/bench_command_start.py`, not here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.runs import clean_env

CHILD = """
import json, sys
from eigtrain import commands
sys.argv = ["x", *json.loads(sys.argv[2])]
command = getattr(commands, {name!r})
try:
    code = command() if {name!r} == "train" else command(sys.argv[1:])
except SystemExit as stop:  # the message an uncaught SystemExit would print, then its status
    if isinstance(stop.code, str):
        print(stop.code, file=sys.stderr)
    code = stop.code if isinstance(stop.code, int) or stop.code is None else 1
print(json.dumps({{"code": code, "torch": "torch" in sys.modules}}), file=sys.stderr)
"""


def _run(name: str, args: list[str]) -> tuple[int | None, bool, str]:
    code = CHILD.format(name=name)
    done = subprocess.run(
        [sys.executable, "-c", code, "-", json.dumps(args)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    *lines, last = done.stderr.strip().splitlines()
    outcome = json.loads(last)
    return outcome["code"], outcome["torch"], "\n".join(lines)


BAD = [
    ("rr", ["embeddings=x.npz", "out=o", "folds=1"], "folds=1"),
    ("rr", ["run_dir=r", "bogus=1"], "unknown key 'bogus'"),
    ("rr", ["encoder=timm:resnet18", "data.root=d", "out=o", "data.augment=nope"], "data.augment='nope'"),
    ("evaluate", ["run_dir=r", "probe=nope"], "probe='nope'"),
    ("evaluate", ["run_dir=r", "random_draws=abc"], "random_draws"),
    ("embed", ["run_dir=r", "out=o", "dtype=int8"], "dtype='int8'"),
    ("export", ["run_dir=r", "out=o", "format=tflite"], "format='tflite'"),
    ("index", ["embeddings=e", "out=o", "kind=hnsw"], "kind='hnsw'"),
    ("index", ["embeddings=e", "out=o", "dims=8", "k=16"], "k=16 must not exceed dims=8"),
    ("shards", ["source=nope", "out=o"], "unknown source 'nope'"),
    ("shards", ["index", "out=x"], "usage: eigtrain-shards index PATTERN"),
    ("synthetic", ["kernel=legendre", "rank=abc"], "rank"),
    ("train", ["stepz=3"], "stepz"),
    ("train", ["objective=nope"], "objective"),
    ("train", ["steps=abc"], "steps"),
]


@pytest.mark.parametrize("name, args, says", BAD, ids=[f"{n}:{a[-1]}" for n, a, _ in BAD])
def test_a_bad_command_line_is_refused_before_torch_is_imported(name, args, says):
    code, torch_imported, stderr = _run(name, args)
    assert code not in (0, None) and says in stderr and len(stderr.splitlines()) == 1, (code, stderr)
    assert not torch_imported, f"eigtrain-{name} imported torch before refusing {args}"


@pytest.mark.parametrize("name", ["rr", "evaluate", "embed", "export", "index", "shards", "synthetic", "train"])
def test_help_comes_before_torch(name):
    code, torch_imported, _ = _run(name, ["--help"])
    assert code in (0, None) and not torch_imported


def test_a_good_command_line_reaches_the_command(tmp_path):
    """Past the configuration check the command runs as before: here it refuses a missing file, which only the
    command itself (with torch) looks for."""
    code, torch_imported, stderr = _run("rr", [f"embeddings={tmp_path / 'missing.npz'}", f"out={tmp_path / 'o'}"])
    assert code == 2 and torch_imported and "missing.npz" in stderr, stderr


def test_every_console_script_is_a_checked_entry_point():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts") if e.name.startswith("eigtrain-")}
    assert scripts and all(v.startswith("eigtrain.commands:") for v in scripts.values()), scripts
