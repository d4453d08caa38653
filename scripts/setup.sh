#!/usr/bin/env bash
# Installs quiver's build dependencies (Debian 12, as root) and builds into build/.
# The CUDA backend is built when nvcc is found (/usr/local/cuda or on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev
          libfmt-dev libgtest-dev libbenchmark-dev libsentencepiece-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${QUIVER_CMAKE_ARGS:-}
cmake --build build -j "${QUIVER_BUILD_JOBS:-$(nproc)}"
