"""docs/configuration.md is what `python -m eigtrain.config_doc` writes from the schema today; a field added to the
schema makes it stale, and the failure is one line naming the command."""

import sys
import textwrap
from pathlib import Path

import pytest

from eigtrain import config_doc

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def regenerate(tmp_path, monkeypatch) -> str:
    """Run the command's entry point into a temporary file and return what it wrote."""
    out = tmp_path / "configuration.md"
    monkeypatch.setattr(sys, "argv", ["config_doc", str(out)])
    config_doc.main()
    return out.read_text()


def staleness(generated: str) -> str | None:
    """One line when the committed reference differs from `generated`, else None."""
    if COMMITTED.is_file() and COMMITTED.read_text() == generated:
        return None
    return f"docs/configuration.md is stale: regenerate it with `{config_doc.COMMAND}`"


def test_configuration_reference_is_current(tmp_path, monkeypatch):
    message = staleness(regenerate(tmp_path, monkeypatch))
    if message:
        pytest.fail(message, pytrace=False)


def test_a_field_added_to_the_schema_makes_it_stale(tmp_path, monkeypatch):
    # A real module on disk: the generator reads each field's trailing comment from its source line.
    (tmp_path / "schema_with_new_key.py").write_text(
        textwrap.dedent("""
        from dataclasses import dataclass
        from typing import Literal

        from eigtrain.schema import TrainConfig


        @dataclass
        class TrainConfigWithNewKey(TrainConfig):
            new_key: int = 3  # a key added to the schema
            new_choice: Literal["fast", "exact"] = "exact"  # its allowed values are its Literal's
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from schema_with_new_key import TrainConfigWithNewKey

    commands = [(name, TrainConfigWithNewKey if name == "eigtrain-train" else cls) for name, cls in config_doc.COMMANDS]
    monkeypatch.setattr(config_doc, "COMMANDS", commands)
    generated = regenerate(tmp_path, monkeypatch)

    assert "| `new_key` | int | `3` | a key added to the schema |" in generated
    assert "| `new_choice` | str: `fast` \\| `exact` | `exact` | its allowed values are its Literal's |" in generated
    assert "| `nesting` | group: `joint` \\| `none` \\| `sequential` | `none` |" in generated  # groups still rows
    assert staleness(generated) == "docs/configuration.md is stale: regenerate it with `python -m eigtrain.config_doc`"


def test_a_subclass_comment_wins_and_a_bare_redefinition_keeps_the_base_comment(tmp_path, monkeypatch):
    (tmp_path / "doc_inheritance.py").write_text(
        textwrap.dedent("""
        from dataclasses import dataclass


        @dataclass
        class Base:
            lr: float = 0.1  # the base's doc
            name: str = "base"  # which option


        @dataclass
        class Option(Base):
            lr: float = 0.5  # the option's own doc
            name: str = "option"
            plain: int = 0
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from doc_inheritance import Option

    assert config_doc.field_docs(Option) == {"lr": "the option's own doc", "name": "which option", "plain": ""}
    table = "\n".join(config_doc.tables("t", Option, prefix="optim."))
    assert "| `optim.lr` | float | `0.5` | the option's own doc |" in table
    assert "| `optim.plain` | int | `0` |  |" in table  # no comment: an empty cell


def test_help_is_usage_not_a_file_named_help(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["config_doc", "--help"])
    with pytest.raises(SystemExit, match="usage: python -m eigtrain.config_doc"):
        config_doc.main()
    assert not list(tmp_path.iterdir())


def test_every_documented_key_has_a_doc_line(tmp_path, monkeypatch):
    """Every key of every command (objective keys included) has its doc: the trailing comment of its field."""
    rows = [line for line in regenerate(tmp_path, monkeypatch).splitlines() if line.startswith("| `")]
    undocumented = [row.split("|")[1].strip() for row in rows if not row.rstrip("|").split("|")[-1].strip()]
    assert len(rows) > 250 and not undocumented, undocumented
    objective_rows = [row for row in rows if row.startswith("| `objective.")]
    assert len(objective_rows) >= 30  # each objective's own table: its coefficients and the reduction keys
