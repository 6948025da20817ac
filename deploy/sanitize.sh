#!/usr/bin/env bash
# The AddressSanitizer + UndefinedBehaviorSanitizer build and the fuzzers
# (docs/security.md, Limits): configures build-asan/ with clang,
# -DDELTASERVE_SANITIZE=address,undefined and -DDELTASERVE_FUZZ=ON, runs the
# tests of the labels in DELTASERVE_SANITIZE_LABELS under the sanitizers, then
# each libFuzzer target for DELTASERVE_FUZZ_SECONDS over its committed corpus.
# Any sanitizer report fails the test it happens in. Prints how long each part
# took. Extra arguments go to the sanitized ctest run.
set -euo pipefail
cd "$(dirname "$0")/.."
labels="${DELTASERVE_SANITIZE_LABELS:-cpu|e2e|cuda-sim}"
fuzz_seconds="${DELTASERVE_FUZZ_SECONDS:-20}"

# halt_on_error: UBSan's first finding ends the process (the build also has
# -fno-sanitize-recover=undefined). LSan suppressions: deploy/sanitizers/lsan.supp
# says which leaks are the libraries' own and why they are not ours.
# quarantine_size_mb: freed memory ASan holds back to catch use after free
# (256 MB by default) counts in a process's RSS, which the limits tests hold
# to a bound; 64 MB keeps them meaningful.
export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1:quarantine_size_mb=64"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/deploy/sanitizers/lsan.supp:print_suppressions=0"

# Warnings are not errors here: the kernels' SIMD code draws clang-only
# warnings (-Wpsabi on the generic level's 8-float vectors) that say nothing
# about memory safety; build/ (GCC, -Werror) is the warnings gate.
start=$(date +%s)
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_WERROR=OFF \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS=-gline-tables-only -DDELTASERVE_CUDA=OFF -DDELTASERVE_BENCH=OFF \
    -DDELTASERVE_SANITIZE=address,undefined -DDELTASERVE_FUZZ=ON \
    -DDELTASERVE_FUZZ_SECONDS="$fuzz_seconds" >/dev/null
cmake --build build-asan --parallel "$(nproc)"
built=$(date +%s)
echo "sanitize: build-asan built in $((built - start)) s"

cd build-asan
status=0
# Not MetricsDeathTest: its "threadsafe" death test (re-executing the test
# binary) hangs under ASan here, waiting on a futex forever with or without
# leak detection; it tests aborts on programmer errors, not memory safety.
# The other death tests pass and stay, except
# CoordinatorTest.AWorkerWhoseThreadCannotStart...: its EXPECT_EXIT child caps
# RLIMIT_AS to make thread creation fail, which ASan's shadow memory (tens of
# TB of reserved address space) cannot live under; the child hung until the
# timeout. It runs in the normal build (build/), which is what it tests.
# Not WorkerLossTest.AttachDetachCycles...: it holds the coordinator's RSS
# within 8 MB over 1000 attach/detach cycles, and ASan's quarantine (64 MB of
# freed memory held back on purpose, with its shadow) grows RSS by design
# (measured: 78 MB to 160 MB); threads and mappings, and the RSS bound, are
# checked in the normal build, and LSan checks leaks here.
# Not HelpTest.BenchmarkProgramsPrintUsage...: build-asan has no benchmark
# programs (DELTASERVE_BENCH=OFF), so it has nothing to run here.
# Not LongContextTest.TinyModelOver256kTokensChunkedEqualsOneShot: it checks
# numbers over 262,144 tokens (48 s in build/, 700 s here, a quarter of this
# whole pass); the same code, chunked Forward calls over KDA and both forms of
# MLA, runs here at shorter lengths (InvarianceTest, the other LongContextTest
# cases, ScoreCliTest's million-token score).
# Not isa_check_*: they check GCC's release binaries (build/), where OpenMP
# regions stay in their CPU level's namespace; clang outlines them into
# .omp_outlined. functions outside it.
# Not format_check, layering_*, compute_check_*: they read the sources with
# clang-format and Python, the same in both builds; build/ runs them.
# Not the kernel tests' middle CPU levels: the generic code and this
# machine's highest level run here (on an AVX-512 machine the AVX2 cases,
# 300 of them, run in build/ only, where their guarded buffers still catch a
# write out of bounds).
# Not most of the whole model on the harness's device (30 s in build/, ten
# times that here): the same device code paths run here in one golden model
# (kimi-linear-tiny, the quickest), the stored weights and the refused pool,
# and in every op's cuda-sim cases.
levels=$(ctest -N 2>/dev/null | grep -oE '[.](avx2|avx512)$' | sort -u || true)
middle=""
if grep -q avx512 <<<"$levels"; then
  middle='|[.]avx2$'
fi
ctest --output-on-failure --timeout 900 -L "$labels" -E '^MetricsDeathTest[.]|^LongContextTest[.]TinyModelOver256k|^isa_check_|^format_check$|^layering_|^compute_check_|^CoordinatorTest[.]AWorkerWhoseThreadCannotStart|^WorkerLossTest[.]AttachDetachCycles|^HelpTest[.]BenchmarkProgramsPrintUsage|^Golden/ModelCudaTest[.]LogitsMatchFloat64Reference/k3_tiny|^CudaModelTest[.](PiecesGive|AFork)'"$middle" "$@" || status=1
tested=$(date +%s)
echo "sanitize: tests labelled '$labels' under ASan+UBSan took $((tested - built)) s"
ctest --output-on-failure -L fuzz || status=1
echo "sanitize: fuzzing took $(($(date +%s) - tested)) s"
exit $status
