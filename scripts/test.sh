#!/usr/bin/env bash
# Set up (or reuse) .venv, install system packages the tests need, run the CPU test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -f scripts/ci_system_deps.sh ]; then bash scripts/ci_system_deps.sh; fi
exec .venv/bin/python -m pytest -q -m "not gpu" "$@"
