// Linear layers: y = x · Wᵀ with W stored [out, in] as PyTorch does, in the
// dtype its checkpoint holds (kernels/tensor.h). x and y are float32 and the
// sums are float32: bf16 and MXFP4 weights widen to float32 exactly, so the
// result is the float32 product with the dequantised weights, to summation
// order. How each size and dtype is computed: kernels/cpu/gemm_cpu.cc.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace deltaserve::kernels {

// y[m, n] = x[m, k] · w[n, k]ᵀ, or y += ... when accumulate, with n = w.rows
// and k = w.cols; rows of x and y at strides ldx >= k and ldy >= n (in
// floats), so a GEMM can read or write a column block of a wider row. y must
// not alias x or w. m == 0 is a no-op.
void LinearStrided(const float* x, int64_t ldx, const Tensor& w, int64_t m, float* y, int64_t ldy,
                   bool accumulate = false);

// Whether a bf16 weight with compute kBF16 (tensor.h) gets the bf16 matmul on
// this CPU (oneDNN on AVX512-BF16 or AMX); elsewhere it computes in float32.
bool Bf16ComputeAvailable();

// Contiguous x [m, k] and y [m, n].
inline void Linear(const float* x, const Tensor& w, int64_t m, float* y, bool accumulate = false) {
  LinearStrided(x, w.cols, w, m, y, w.rows, accumulate);
}

}  // namespace deltaserve::kernels
