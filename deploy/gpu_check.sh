#!/usr/bin/env bash
# The GPU check, in two steps, for a GPU machine that has the CUDA toolkit but
# none of the packages the build needs (gRPC, abseil, GoogleTest, oneDNN):
#
#   bash deploy/gpu_check.sh pack   # here: builds the kernel tests with CUDA
#                                   # into one binary, and the model's device
#                                   # test, and packs them with the shared
#                                   # libraries they need in build-gpu/
#   bash deploy/gpu_check.sh run    # on the GPU machine, from the repository
#                                   # root with build-gpu/ beside it: runs
#                                   # every CUDA case of the kernel tests and
#                                   # the model on the GPU, writes the results
#                                   # under $OUT
#
# `run` fails when a test fails, and also when no GPU is usable: the cases
# are then skipped, which is not a pass. The CUDA runtime and cuBLAS come
# from the GPU machine's toolkit (/usr/local/cuda/lib64); the pack carries the
# rest (the C++ runtime, OpenMP, oneDNN compressed), so it stays under
# 64 MiB. The kernel tests' golden files are read from ../shared/golden.
set -euo pipefail
cd "$(dirname "$0")/.."

pack_dir=build-gpu
mode="${1:-}"

case "$mode" in
  pack)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_WERROR=ON >/dev/null
    if ! grep -q '^#define DELTASERVE_HAVE_CUDA 1' build/generated/config/runtime/common/build_config.h; then
      echo "gpu_check: build/ has no CUDA (no nvcc found); nothing to pack" >&2
      exit 1
    fi
    cmake --build build --target gpu_kernel_tests model_cuda_test --parallel "$(nproc)"
    rm -rf "$pack_dir"
    mkdir -p "$pack_dir/bin" "$pack_dir/lib"
    for test in gpu_kernel_tests model_cuda_test; do
      strip -o "$pack_dir/bin/$test" "build/bin/$test"
    done
    # The non-CUDA shared libraries the binaries link, from this machine.
    ldd build/bin/gpu_kernel_tests build/bin/model_cuda_test | awk '/=> \// {print $3}' |
        sort -u | while read -r lib; do
      case "$(basename "$lib")" in
        libcuda*.so* | libcublas*.so* | libc.so* | libm.so* | ld-linux*) ;;
        libdnnl.so*) python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as f, lzma.open(sys.argv[2], "wb", preset=6) as g:
    shutil.copyfileobj(f, g)' "$lib" "$pack_dir/lib/$(basename "$lib").xz" ;;
        *) cp -L "$lib" "$pack_dir/lib/" ;;
      esac
    done
    du -sh "$pack_dir"
    echo "gpu_check: packed $pack_dir; carry it and run: bash deploy/gpu_check.sh run"
    ;;
  run)
    out="${OUT:-$PWD/gpu-check-out}"
    mkdir -p "$out"
    for test in gpu_kernel_tests model_cuda_test; do
      [[ -x "$pack_dir/bin/$test" ]] || {
        echo "gpu_check: $pack_dir/bin/$test is missing: run 'pack' where it builds" >&2
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
    status=0
    for run in "gpu_kernel_tests */cuda:*_cuda" "model_cuda_test *"; do
      read -r test filter <<<"$run"
      DELTASERVE_SOURCE_DIR="$PWD" DELTASERVE_CUDA_BACKEND=gpu timeout 300 "$pack_dir/bin/$test" \
          --gtest_filter="$filter" --gtest_output="xml:$out/$test.xml" \
          2>&1 | tee "$out/$test.log" || status=1
      if grep -q '\[  SKIPPED \]' "$out/$test.log"; then
        echo "gpu_check: $test skipped cases (no usable GPU?): not a pass" >&2
        status=1
      fi
    done
    echo "gpu_check: $([[ $status -eq 0 ]] && echo passed || echo FAILED); results in $out"
    exit $status
    ;;
  *)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
