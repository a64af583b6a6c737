"""The wheel ships the configs and the launcher inside the package; `eigtrain` is its only top-level import.

(tools/ci_wheel.sh, run by .ci/run, installs the wheel into a fresh virtual environment and trains with it
from an unrelated directory.)
"""

import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_configs_and_launcher_under_eigtrain_only(tmp_path):
    subprocess.run(["bash", str(REPO / "tools" / "ci_wheel.sh"), "--build", str(tmp_path)], check=True, timeout=300)
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
    ):
        assert f"{command} = " in scripts


def test_configs_load_from_the_package_from_any_directory(tmp_path, monkeypatch):
    from eigtrain.train import CONFIG_PACKAGE, compose_config

    monkeypatch.chdir(tmp_path)
    assert CONFIG_PACKAGE == "eigtrain.configs"
    assert compose_config(["experiment=cpu_debug"]).name == "cpu_debug"
    source = "".join((REPO / "eigtrain" / f).read_text() for f in ("train.py", "schema/combinations.py"))
    assert '/ "configs"' not in source  # no path into the checkout
