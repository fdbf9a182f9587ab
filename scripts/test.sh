#!/usr/bin/env bash
# Set up (or reuse) .venv, install the system packages the tests need, then run the CPU tests: three
# workers on two cores (pytest-xdist, a file per worker at a time, one torch thread each: a worker waiting
# on a subprocess or a server leaves its core to the others; NONDET_TEST_WORKERS=N), and the
# 15 slowest tests printed at the end.
#   bash scripts/test.sh          every test but the `slow` selection (the README's test command)
#   bash scripts/test.sh --slow   only the `slow` selection: real models end to end, Inductor, TP groups
#   bash scripts/test.sh --all    both (CI runs both)
# Further arguments go to pytest (a file, -k, -x, -n 0 for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
selection="not gpu and not slow"
case "${1:-}" in
  --slow) selection="slow and not gpu"; shift ;;
  --all) selection="not gpu"; shift ;;
esac
bash scripts/setup.sh
if [ -f scripts/ci_system_deps.sh ]; then bash scripts/ci_system_deps.sh; fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # a worker per core or more: no oversubscribed thread pools
exec .venv/bin/python -m pytest -q -m "$selection" -n "${NONDET_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder --durations=15 "$@"
