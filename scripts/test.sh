#!/usr/bin/env bash
# Set up (or refresh) .venv with the validated stack and test tools, then run the gates
# CI runs: ruff lint, ruff format check, mypy, and the whole pytest suite.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -k sampler
# Without arguments the suite runs in two pytest-xdist workers, one test file per worker
# at a time (module-scoped engines stay shared): engine starts are mostly one busy core.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh --dev
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy"
.venv/bin/mypy
echo "==> pytest"
if [ "$#" -eq 0 ]; then
  # --no-loadscope-reorder: files in collection order, where tests/conftest.py puts the
  # longest modules first (xdist would otherwise start the files with most tests first).
  # --durations: the slowest tests, to keep the suite in budget.
  set -- -n 2 --dist loadfile --no-loadscope-reorder --durations=25
fi
.venv/bin/python -m pytest "$@"
