#!/usr/bin/env bash
# The GPU check, in two steps, for a GPU machine that has the CUDA toolkit and
# python3 with torch and triton but none of the packages the build needs
# (gRPC, abseil, GoogleTest, oneDNN) and no network:
#
#   bash deploy/gpu_check.sh pack   # here: builds the kernel tests with CUDA
#                                   # into one binary, the model's device
#                                   # test and the benchmarks (model_bench,
#                                   # kda_bench), packs them with the shared
#                                   # libraries they need in build-gpu/, and
#                                   # downloads the wheels of fla-core (which
#                                   # holds flash-linear-attention's
#                                   # chunk_kda) and einops into it
#   bash deploy/gpu_check.sh run    # on the GPU machine, from the repository
#                                   # root with build-gpu/ beside it: runs
#                                   # every CUDA case of the kernel tests and
#                                   # the model on the GPU (its goldens), then
#                                   # the benchmarks, and writes the results
#                                   # and report.md under $OUT
#
# The benchmarks, in one run, each next to limits measured in that run:
# model_bench --device cuda (prefill tokens/s at 4k and 32k against cuBLASLt's
# bf16 GEMM rate, decode tokens/s at batch 1 and 32 against the device's read
# rate) on k3-small and on a K3-width slice (bench/k3_slice_config.json, its
# random checkpoint made there), and KDA's chunked prefill against
# chunk_kda on the same shapes (bench/fla_kda_compare.py).
#
# `run` fails when a test or a benchmark fails, and also when no GPU is
# usable: the cases are then skipped, which is not a pass. Every step has a
# time limit and the whole run stays under 8 minutes (RUN_BUDGET_S, 470 s); a
# step the budget leaves no time for is reported as not run, a failure. The
# CUDA runtime and cuBLAS come from the GPU machine's toolkit
# (/usr/local/cuda/lib64); the pack carries the rest (the C++ runtime,
# OpenMP, abseil, oneDNN compressed), so it stays under 64 MiB. The kernel
# tests' golden files are read from ../shared/golden.
set -euo pipefail
cd "$(dirname "$0")/.."

pack_dir=build-gpu
mode="${1:-}"

# What run executes: the tests, then the benchmarks.
binaries="gpu_kernel_tests model_cuda_test model_bench kda_bench"
# chunk_kda lives in fla-core (flash-linear-attention's kernels; the
# flash-linear-attention package adds models and needs transformers); it
# imports einops and packaging beyond torch and triton. Pinned, so that two
# runs compare the same code.
wheels="fla-core==0.6.0 einops==0.8.2 packaging==26.4"

case "$mode" in
  pack)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_WERROR=ON >/dev/null
    if ! grep -q '^#define DELTASERVE_HAVE_CUDA 1' build/generated/config/runtime/common/build_config.h; then
      echo "gpu_check: build/ has no CUDA (no nvcc found); nothing to pack" >&2
      exit 1
    fi
    # shellcheck disable=SC2086
    cmake --build build --target $binaries --parallel "$(nproc)"
    rm -rf "$pack_dir"
    mkdir -p "$pack_dir/bin" "$pack_dir/lib" "$pack_dir/wheels"
    for binary in $binaries; do
      strip -o "$pack_dir/bin/$binary" "build/bin/$binary"
    done
    # The non-CUDA shared libraries the binaries link, from this machine.
    for binary in $binaries; do ldd "build/bin/$binary"; done | awk '/=> \// {print $3}' |
        sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libcuda*.so* | libcublas*.so* | libc.so* | libm.so* | ld-linux*) ;;
        libdnnl.so*) python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as f, lzma.open(sys.argv[2], "wb", preset=6) as g:
    shutil.copyfileobj(f, g)' "$lib" "$pack_dir/lib/$(basename "$lib").xz" ;;
        *) cp -L "$lib" "$pack_dir/lib/" ;;
      esac
    done
    # shellcheck disable=SC2086
    if ! python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$pack_dir/wheels" \
        $wheels; then
      echo "gpu_check: cannot download $wheels (the KDA comparison needs them)" >&2
      exit 1
    fi
    # What travels: the working tree (git's files, tracked and new) and the pack.
    pack_kib=$(du -sk "$pack_dir" | cut -f1)
    tree_kib=$(git ls-files -z --cached --others --exclude-standard |
        du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
    echo "gpu_check: $pack_dir $((pack_kib / 1024)) MiB, the tree $((tree_kib / 1024)) MiB"
    if ((pack_kib + tree_kib > 63 * 1024)); then
      echo "gpu_check: the tree and $pack_dir are over 63 MiB; what travels must stay under 64" >&2
      exit 1
    fi
    echo "gpu_check: packed $pack_dir; carry it and run: bash deploy/gpu_check.sh run"
    ;;
  run)
    start=$SECONDS
    budget="${RUN_BUDGET_S:-470}"
    out="${OUT:-$PWD/gpu-check-out}"
    mkdir -p "$out"
    for binary in $binaries; do
      [[ -x "$pack_dir/bin/$binary" ]] || {
        echo "gpu_check: $pack_dir/bin/$binary is missing: run 'pack' where it builds" >&2
        exit 1
      }
    done
    for xz in "$pack_dir"/lib/*.xz; do
      [[ -e "$xz" ]] || continue
      python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1], "rb") as f, open(sys.argv[2], "wb") as g:
    shutil.copyfileobj(f, g)' "$xz" "${xz%.xz}"
    done
    nvidia-smi -L 2>&1 | tee "$out/gpus.txt" || true
    export LD_LIBRARY_PATH="$PWD/$pack_dir/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export DELTASERVE_SOURCE_DIR="$PWD" DELTASERVE_CUDA_BACKEND=gpu
    status=0
    steps="$out/steps.md"
    : >"$steps"
    # step NAME LIMIT_S COMMAND...: runs the command under `timeout` (its
    # limit, or what is left of the budget if less), its output to the
    # console and $out/NAME.log, and records the outcome in $steps.
    step() {
      local name=$1 limit=$2 left rc=0 began=$SECONDS result
      shift 2
      left=$((budget - (SECONDS - start)))
      ((limit <= left)) || limit=$left
      if ((limit < 10)); then
        echo "| $name | FAILED: not run, the time budget is spent | 0 | \`$*\` |" >>"$steps"
        echo "gpu_check: $name not run: the time budget is spent" >&2
        status=1
        return 0
      fi
      echo "gpu_check: $name (at most ${limit} s): $*"
      timeout -k 5 "$limit" "$@" 2>&1 | tee "$out/$name.log" || rc=$?
      if ((rc == 124 || rc == 137)); then
        result="FAILED: timed out after $limit s"
      elif ((rc != 0)); then
        result="FAILED: exit status $rc"
      elif grep -q '\[  SKIPPED \]' "$out/$name.log"; then
        result="FAILED: cases skipped (no usable GPU?), which is not a pass"
      else
        result=passed
      fi
      [[ $result == passed ]] || status=1
      echo "| $name | $result | $((SECONDS - began)) | \`$*\` |" >>"$steps"
      echo "gpu_check: $name: $result"
    }

    # Each step's own limit; together they exceed the budget, so a step that
    # ends early leaves its time to the later ones (chunk_kda's first calls
    # include triton's autotuning).
    step gpu_kernel_tests 120 "$pack_dir/bin/gpu_kernel_tests" --gtest_filter='*/cuda:*_cuda' \
        --gtest_output="xml:$out/gpu_kernel_tests.xml"
    step model_cuda_test 60 "$pack_dir/bin/model_cuda_test" \
        --gtest_output="xml:$out/model_cuda_test.xml"
    bench_flags=(--device cuda --compute-dtype bf16 --prompts "4096,32768" --decode 32
                 --decode-batch "1,32")
    step model_bench_k3_small 60 "$pack_dir/bin/model_bench" "${bench_flags[@]}"
    # The slice's random checkpoint (9.4 GiB) is made on this machine.
    step model_bench_k3_slice 150 "$pack_dir/bin/model_bench" --config bench/k3_slice_config.json \
        --experts mxfp4 "${bench_flags[@]}"
    pydeps="$(mktemp -d)"
    wheel_files=("$pack_dir"/wheels/fla_core-*.whl "$pack_dir"/wheels/einops-*.whl)
    if ! python3 -c 'import packaging' 2>/dev/null; then
      wheel_files+=("$pack_dir"/wheels/packaging-*.whl)
    fi
    python3 -m pip install --quiet --no-index --no-deps --target "$pydeps" "${wheel_files[@]}" ||
        echo "gpu_check: cannot install ${wheel_files[*]}; the KDA comparison will fail" >&2
    step kda_vs_fla 150 env PYTHONPATH="$pydeps${PYTHONPATH:+:$PYTHONPATH}" python3 \
        bench/fla_kda_compare.py --kda-bench "$pack_dir/bin/kda_bench" --tokens 4096,32768 \
        --heads 96
    rm -rf "$pydeps"

    {
      echo "# GPU check"
      echo
      echo "- commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
      echo "- GPUs: $(tr '\n' ' ' <"$out/gpus.txt")"
      echo "- result: $([[ $status -eq 0 ]] && echo passed || echo FAILED), in $((SECONDS - start)) s"
      echo
      echo "| step | result | s | command |"
      echo "|---|---|---|---|"
      cat "$steps"
      for test in gpu_kernel_tests model_cuda_test; do
        [[ -e "$out/$test.log" ]] || continue
        echo
        echo "## $test"
        echo
        echo '```'
        # The totals, and the names of the failed cases.
        grep -E '^\[==========\] .* ran|^\[  (PASSED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \] .*[^)]$' \
            "$out/$test.log" || true
        echo '```'
      done
      for bench in model_bench_k3_small model_bench_k3_slice kda_vs_fla; do
        echo
        echo "## $bench: $(grep "^| $bench |" "$steps" | cut -d'|' -f3 | xargs)"
        echo
        grep "^| $bench |" "$steps" | cut -d'|' -f5- | sed 's/ |$//; s/^ */command: /'
        echo
        [[ -e "$out/$bench.log" ]] && cat "$out/$bench.log"
      done
    } >"$out/report.md"
    echo "gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED); report in $out/report.md"
    exit $status
    ;;
  *)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
