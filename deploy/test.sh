#!/usr/bin/env bash
# The README's second command: set up, build, and run the whole test suite;
# then, when no arguments are given (CI), the sanitizer build's tests and the
# fuzzers (deploy/sanitize.sh). Extra arguments go to ctest (e.g. -L cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh --test
# ON said outright: a build/ configured by deploy/quickstart.sh has the tests off.
bash deploy/build.sh -DDELTASERVE_TESTS=ON
sanitize_build=""
if (($# == 0)); then
  # The sanitizer pass's build compiles beside the test run at idle priority
  # (SCHED_IDLE): it gets only the CPU the tests leave unused (a test waiting
  # on its servers, a client starting), never a time slice a test wants, and
  # the pass after the tests finds most of its build done.
  # Its own session, so that a failing test run stops all of it (ninja and
  # the compilers too).
  DELTASERVE_SANITIZE_BUILD_ONLY=1 setsid chrt --idle 0 bash deploy/sanitize.sh \
      >build/sanitize-build.log 2>&1 &
  sanitize_build=$!
  trap '[[ -n "$sanitize_build" ]] && kill -- "-$sanitize_build" 2>/dev/null' EXIT
fi
cd build
# One test at a time: each already uses every core (OpenMP, oneDNN on the same pool), and two
# side by side make each other's thread teams wait for a time slice at every
# barrier, which is far slower than running them in turn.
ctest --output-on-failure --timeout 900 "$@"
cd ..
if (($# == 0)); then
  # The build's own failure shows again, in full, when sanitize.sh builds.
  wait "$sanitize_build" || true
  sanitize_build=""
  echo "test.sh: the sanitizer build beside the tests: $(grep '^sanitize:' build/sanitize-build.log || echo 'not finished')"
  bash deploy/sanitize.sh
fi
