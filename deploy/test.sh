#!/usr/bin/env bash
# The README's second command: set up, build, and run the whole test suite;
# then, when no arguments are given (CI), the sanitizer build's tests and the
# fuzzers (deploy/sanitize.sh). Extra arguments go to ctest (e.g. -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
# ON said outright: a build/ configured by deploy/quickstart.sh has the tests off.
bash deploy/build.sh -DDELTASERVE_TESTS=ON
cd build
# One test at a time: each already uses every core (OpenMP, oneDNN on the same pool), and two
# side by side make each other's thread teams wait for a time slice at every
# barrier, which is far slower than running them in turn.
ctest --output-on-failure --timeout 900 "$@"
cd ..
if (($# == 0)); then
  bash deploy/sanitize.sh
fi
