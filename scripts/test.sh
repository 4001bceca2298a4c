#!/usr/bin/env bash
# Set up (or refresh) .venv with the validated stack and test tools, then run the gates
# CI runs: ruff lint, ruff format check, mypy, and the whole pytest suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -k sampler
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --dev
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest"
.venv/bin/python -m pytest "$@"
