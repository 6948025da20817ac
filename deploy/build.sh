#!/usr/bin/env bash
# Configures and builds deltaserve into build/ (executables in build/bin/).
# Extra arguments go to cmake, e.g. -DDELTASERVE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_WERROR=ON "$@" >/dev/null
cmake --build build --parallel "$(nproc)"
