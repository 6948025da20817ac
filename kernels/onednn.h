// oneDNN's bf16 matmul, for the CPU GEMMs of kernels/cpu/gemm_cpu.cc. In its
// own file, compiled once at the baseline level: oneDNN's C++ header is inline
// code, which must not be compiled per CPU level (kernels/cpu/dispatch.h).
// Internal to the kernels.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::onednn {

// y[m, n] (+)= x[m, k] · w[n, k]ᵀ with x and w bf16, row-major and contiguous,
// the products summed in float32, by oneDNN's matmul (AVX512-BF16 or AMX
// where the CPU has them). The caller rounds float32 activations into x
// (vector code of its CPU level). False, with nothing written, where oneDNN
// has no bf16 matmul for this CPU or this shape.
bool Bf16Matmul(const uint16_t* x, const uint16_t* w, int64_t m, int64_t n, int64_t k, float* y,
                int64_t ldy, bool accumulate);

// Whether oneDNN has a bf16 matmul on this CPU (asked once).
bool HasBf16Matmul();

}  // namespace deltaserve::kernels::onednn
