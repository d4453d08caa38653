#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test. GPU tests (label gpu) skip
# cleanly on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
