#!/usr/bin/env bash
# The house rules, as .ci/run checks them before the tests: ruff's lint and its formatter (pyproject.toml's
# [tool.ruff]; line length 120), then mypy's type check of the package ([tool.mypy]). `bash tools/lint.sh --fix`
# rewrites the files instead of checking them (the type check still runs: it fixes nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/venv.sh
venv_install '[dev]'
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/python -m ruff check --fix .
  .venv/bin/python -m ruff format .
else
  .venv/bin/python -m ruff check .
  .venv/bin/python -m ruff format --check .
fi
.venv/bin/python -m mypy
.venv/bin/lint-imports  # the layers and no import cycle (pyproject.toml [tool.importlinter])
