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


def test_readme_is_a_front_page_with_figures_only_in_its_generated_table():
    """At most 100 lines, and no measured figure (a decimal or a thousands-separated number) outside the generated
    headline block and code: figures live in generated tables (issue 35). Python's version is no figure."""
    import re

    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 100
    prose = re.sub(r"<!-- headline:.*?<!-- /headline -->", "", text, flags=re.S)
    prose = re.sub(r"```.*?```|`[^`\n]*`|\]\([^)]*\)", "", prose, flags=re.S)
    prose = re.sub(r"Python ≥ \d+\.\d+", "", prose)
    figures = re.findall(r"(?<![\w.])\d+(?:\.\d+|,\d{3})+(?![\w.])", prose)
    assert not figures, f"figures outside README's generated table: {figures}"
