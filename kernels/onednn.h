// oneDNN's bf16 matmul, for the CPU GEMMs of kernels/cpu/gemm_cpu.cc. In its
// own file, compiled once at the baseline level: oneDNN's C++ header is inline
// code, which must not be compiled per CPU level (kernels/cpu/dispatch.h).
// Internal to the kernels.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::onednn {

// y[m, n] (+)= bf16(x)[m, k] · w[n, k]ᵀ with w bf16 [n, k] row-major, x rounded
// to bf16 (to nearest even) and the products summed in float32, by oneDNN's
// matmul (AVX512-BF16 or AMX where the CPU has them). False, with nothing
// written, where oneDNN has no bf16 matmul for this CPU.
bool Bf16Matmul(const float* x, int64_t ldx, const uint16_t* w, int64_t m, int64_t n, int64_t k,
                float* y, int64_t ldy, bool accumulate);

// Whether oneDNN has a bf16 matmul on this CPU (asked once).
bool HasBf16Matmul();

}  // namespace deltaserve::kernels::onednn
