#!/usr/bin/env bash
# Set up (with test tools) and run the whole test suite: lint, format check, import layers
# (import-linter contracts in pyproject.toml), pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
PYTHONPATH=. .venv/bin/lint-imports
.venv/bin/python -m pytest -q "$@"
