#!/usr/bin/env bash
# The README's second command: set up, build, and run the whole test suite.
# Extra arguments go to ctest (e.g. -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
bash deploy/build.sh
cd build
ctest --output-on-failure --parallel "$(nproc)" --timeout 900 "$@"
