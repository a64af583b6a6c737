"""README's headline table is generated from the stored claims reports (benchmarks/claims/*/report.json) by
tools/claims_table.py; this fails when the README no longer says what those reports hold."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _claims_table():
    spec = importlib.util.spec_from_file_location("claims_table", ROOT / "tools" / "claims_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_headline_is_the_claims_table(monkeypatch):
    monkeypatch.chdir(ROOT)  # the tool reads benchmarks/claims relative to the repository root
    claims = _claims_table()
    expected = "\n".join(claims.headline(claims.load()))
    assert expected in (ROOT / "README.md").read_text(), (
        "README's headline table is stale: run python tools/claims_table.py"
    )
