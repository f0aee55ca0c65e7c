#!/usr/bin/env bash
# Set up (with test tools) and run the whole test suite: lint, format check, pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q "$@"
