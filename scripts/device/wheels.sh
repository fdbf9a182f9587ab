#!/usr/bin/env bash
# Fill .device-wheels/ (in .gitignore: list it in the device call's carry) with a transformers release and
# its dependencies for the device image's Python 3.12, without numpy and torch (the image has them).
# scripts/gpu.sh installs it first where the folder exists: the image ships transformers 5.17, whose
# tensor-parallel modules break torch.compile's graph (docs/tensor-parallel.md).
#   bash scripts/device/wheels.sh [VERSION]        (default 5.24.0; about 29 MB)
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-5.24.0}
rm -rf .device-wheels && mkdir -p .device-wheels
python3 -m pip download -q -d .device-wheels --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "transformers==$version"
rm -f .device-wheels/numpy-* .device-wheels/torch-*
echo "$version" > .device-wheels/VERSION
du -sh .device-wheels
