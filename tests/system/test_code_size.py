"""The house's size rules for eigtrain/: no module over 350 lines, no function over 70 (small modules with one job)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "eigtrain"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 70


def _sizes():
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        yield path, None, len(source.splitlines())
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path, node.name, (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_module_over_350_lines_and_no_function_over_70():
    too_long = [
        f"{path.relative_to(PACKAGE.parent)}{f':{name}' if name else ''} ({lines} lines)"
        for path, name, lines in _sizes()
        if lines > (MAX_FUNCTION_LINES if name else MAX_MODULE_LINES)
    ]
    assert not too_long, too_long
