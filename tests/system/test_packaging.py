"""The wheel ships the configs and the launcher inside the package; `eigtrain` is its only top-level import; installed
into a fresh virtual environment it trains from an unrelated directory (tools/ci_wheel.sh, run here: the suite that
.ci/run runs builds the wheel once)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.runs import clean_env

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_trains_elsewhere_and_holds_configs_and_launcher_under_eigtrain_only(tmp_path):
    env = {"PYTHON": sys.executable, **clean_env()}  # an explicit PYTHON (the build interpreter) wins
    subprocess.run(
        ["bash", str(REPO / "tools" / "ci_wheel.sh"), "--keep", str(tmp_path)], check=True, timeout=600, env=env
    )
    (wheel,) = tmp_path.glob("eigtrain-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"eigtrain/configs/{p.relative_to(REPO / 'configs')}" for p in (REPO / "configs").rglob("*.yaml")}
    sources |= {f"eigtrain/launch/{p.name}" for p in (REPO / "launch").glob("*.py")}
    sources |= {str(p.relative_to(REPO)) for p in (REPO / "eigtrain").rglob("*.py") if "__pycache__" not in p.parts}
    assert len(sources) > 80 and not sources - names, sorted(sources - names)
    assert {n.split("/")[0] for n in names if not n.startswith("eigtrain-")} == {"eigtrain"}
    info = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(info).decode().split() == ["eigtrain"]
    scripts = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for command in (
        "eigtrain-train",
        "eigtrain-rr",
        "eigtrain-eval",
        "eigtrain-embed",
        "eigtrain-shards",
        "eigtrain-synthetic",
        "eigtrain-export",
    ):
        assert f"{command} = " in scripts


def test_configs_load_from_the_package_from_any_directory(tmp_path, monkeypatch):
    from eigtrain.train.command import CONFIG_PACKAGE, compose_config

    monkeypatch.chdir(tmp_path)
    assert CONFIG_PACKAGE == "eigtrain.configs"
    assert compose_config(["experiment=cpu_debug"]).name == "cpu_debug"
    source = "".join((REPO / "eigtrain" / f).read_text() for f in ("train/command.py", "train/checks.py"))
    assert '/ "configs"' not in source  # no path into the checkout
