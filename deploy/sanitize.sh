#!/usr/bin/env bash
# The AddressSanitizer + UndefinedBehaviorSanitizer build and the fuzzers
# (docs/security.md, Limits): configures build-asan/ with clang,
# -DDELTASERVE_SANITIZE=address,undefined and -DDELTASERVE_FUZZ=ON, builds
# and runs the tests named below under the sanitizers, then each libFuzzer
# target for DELTASERVE_FUZZ_SECONDS over its committed corpus. Any
# sanitizer report fails the test it happens in. Prints how long each part
# took. Extra arguments go to both sanitized ctest runs (e.g. -R Limits).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds="${DELTASERVE_FUZZ_SECONDS:-10}"

# halt_on_error: UBSan's first finding ends the process (the build also has
# -fno-sanitize-recover=undefined). LSan suppressions: deploy/sanitizers/lsan.supp
# says which leaks are the libraries' own and why they are not ours.
# quarantine_size_mb: freed memory ASan holds back to catch use after free
# (256 MB by default) counts in a process's RSS, which the limits tests hold
# to a bound; 64 MB keeps them meaningful.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1:quarantine_size_mb=64"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/deploy/sanitizers/lsan.supp:print_suppressions=0"

# What this pass builds and runs: the tests of the code that takes bytes
# from outside (parsers, validators, the servers, the coordinator's peers,
# batch's files), of the model and its state end to end, and of the CPU
# kernels at this machine's highest level (labels cpu and e2e), less what is
# left out below; then each fuzzer. Everything else runs in build/ only.
#
# Test executables not built here, each covered by what runs here or testing
# no memory handling of its own:
# - the MPI, Slurm and multihost tests (labels mpi, slurm, multihost):
#   build/ runs them;
# - long_context_test (262,144-token runs, 700 s here; chunked Forward calls
#   over KDA and both forms of MLA run in InvarianceTest and ScoreCliTest);
# - worker_loss_e2e_test and worker_mpi_e2e_test (workers killed and
#   replaced, 280 s here; ForgedWorkerTest sends the coordinator what a
#   hostile worker would), progress_e2e_test (progress reports of long
#   prefills, 110 s), batch_serve_e2e_test (batch through a server;
#   batch_cli_test and the batch_line fuzzer read batch's files here);
# - stage_plan_test, gpu_plan_test, plan_cli_test, chunk_cost_test,
#   shard_test, weight_spec_test: arithmetic over model shapes and tables
#   of tensor names (100 s here); resident_weights_test measures page
#   residency, which ASan's shadow pages blur;
# - model_cuda_test and simt_test: the CUDA code on the host's SIMT harness
#   (label cuda-sim), 200 s here even without detect_stack_use_after_return
#   (its fibers' frames make that 4-5x slower); build/ runs it, where the
#   kernel tests' guard bands catch a write out of bounds.
not_built='^(long_context_test|model_cuda_test|simt_test|worker_loss_e2e_test|worker_mpi_e2e_test|progress_e2e_test|batch_serve_e2e_test|stage_plan_test|gpu_plan_test|plan_cli_test|chunk_cost_test|shard_test|weight_spec_test|resident_weights_test|[a-z_]+_(mpi|mpirun|slurm|multihost)_test)$'

# Warnings are not errors here: the kernels' SIMD code draws clang-only
# warnings (-Wpsabi on the generic level's 8-float vectors) that say nothing
# about memory safety; build/ (GCC, -Werror) is the warnings gate.
start=$(date +%s)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_WERROR=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS=-gline-tables-only -DDELTASERVE_CUDA=OFF -DDELTASERVE_BENCH=OFF \
    -DDELTASERVE_SANITIZE=address,undefined -DDELTASERVE_FUZZ=ON \
    -DDELTASERVE_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
# The kernel tests at this machine's highest CPU level, the one deltaserve
# runs at: the others run in build/, where their guarded buffers catch a
# write out of bounds, and the whole model here reads and writes through
# the highest level's kernels.
levels=$(ninja -C build-asan -t targets | grep -oE '^simd_test_[a-z0-9]+' | sed 's/^simd_test_//' | sort -u)
highest=generic
for level in avx2 avx512; do
  if grep -qx "$level" <<<"$levels"; then highest=$level; fi
done
other_levels=""
for level in $levels; do
  if [[ "$level" != "$highest" ]]; then
    other_levels+="|[.]$level\$"
    not_built="${not_built%)\$}|simd_test_$level)\$"
  fi
done
mapfile -t targets < <(ninja -C build-asan -t targets |
  sed -nE 's/^([a-z0-9_]+(_test|_fuzz)(_[a-z0-9]+)?): phony$/\1/p' | grep -vE "$not_built")
cmake --build build-asan --parallel "$(nproc)" --target deltaserve deltaserve_python_stubs \
    "${targets[@]}"
built=$(date +%s)
echo "sanitize: build-asan built (${#targets[@]} test and fuzz executables) in $((built - start)) s"

cd build-asan
status=0
# Cases left out of the built executables:
# MetricsDeathTest: its "threadsafe" death test (re-executing the test
# binary) hangs under ASan here, waiting on a futex forever with or without
# leak detection; it tests aborts on programmer errors, not memory safety.
# The other death tests pass and stay, except
# CoordinatorTest.AWorkerWhoseThreadCannotStart...: its EXPECT_EXIT child caps
# RLIMIT_AS to make thread creation fail, which ASan's shadow memory (tens of
# TB of reserved address space) cannot live under; the child hung until the
# timeout. It runs in the normal build (build/), which is what it tests.
# HelpTest.BenchmarkProgramsPrintUsage...: build-asan has no benchmark
# programs (DELTASERVE_BENCH=OFF), so it has nothing to run here.
# ScoreCliTest.MillionTokenDocument...: a million tokens through the model
# (50 s in build/, several minutes here); the same chunked scoring runs
# here in the file's shorter cases.
# isa_check_*: they check GCC's release binaries (build/), where OpenMP
# regions stay in their CPU level's namespace; clang outlines them into
# .omp_outlined. functions outside it.
# format_check, layering_*, compute_check_*, docs_check_*: they read the
# sources with clang-format and Python, the same in both builds; build/ runs
# them.
# ServeLoadTest: many concurrent requests with a long prefill beside them
# (80 s here); the servers' hostile-input cases (SecurityTest, LimitsTest,
# the H2 guard's tests) run here.
# H2SlotsTest.IdleSocketsDoNotDelayAuthenticatedCalls: how long calls wait
# beside thousands of idle sockets (38 s here, 7 s in build/); the guard's
# handling of those sockets' bytes runs here in H2GuardTest and H2FloodTest.
# CoordinatorTest.PrefillChunksShrink... and StepsPromiseASuccessor...: how
# the scheduler cuts 6,000- and 3,000-token prompts, over the real model
# (28 s here); the coordinator's handling of what workers send runs here in
# its other cases and in ForgedWorkerTest.
ctest --output-on-failure --timeout 900 -L 'cpu|e2e' -E '^MetricsDeathTest[.]|^isa_check_|^format_check$|^layering_|^compute_check_|^docs_check_|^CoordinatorTest[.]AWorkerWhoseThreadCannotStart|^HelpTest[.]BenchmarkProgramsPrintUsage|^ScoreCliTest[.]MillionToken|^ServeLoadTest[.]|^H2SlotsTest[.]IdleSocketsDoNotDelay|^CoordinatorTest[.](PrefillChunksShrink|StepsPromiseASuccessorWhile)'"$other_levels" "$@" || status=1
tested=$(date +%s)
echo "sanitize: tests labelled cpu|e2e under ASan+UBSan took $((tested - built)) s"
ctest --output-on-failure -L fuzz || status=1
echo "sanitize: fuzzing took $(($(date +%s) - tested)) s"
exit $status
