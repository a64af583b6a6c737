#!/usr/bin/env bash
# The house rules, as .ci/run checks them before the tests: ruff's lint and its formatter (pyproject.toml's
# [tool.ruff]; line length 120). `bash tools/lint.sh --fix` rewrites the files instead of checking them.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev]'
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff check --fix .
  .venv/bin/ruff format .
else
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
fi
