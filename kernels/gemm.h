// Linear layers: y = x · Wᵀ with W stored [out, in] as PyTorch does. The CPU
// path is OpenBLAS sgemm (docs/architecture.md says why that BLAS).
#pragma once

#include <cstdint>

namespace deltaserve::kernels {

// y[m, n] = x[m, k] · w[n, k]ᵀ, or y += ... when accumulate. All row-major and
// contiguous; y must not alias x or w. m == 0 is a no-op.
void Linear(const float* x, const float* w, int64_t m, int64_t n, int64_t k, float* y,
            bool accumulate = false);

// Same with explicit leading dimensions (row strides, in elements) for x and y,
// so a GEMM can read or write a column block of a wider row.
void LinearStrided(const float* x, int64_t ldx, const float* w, int64_t m, int64_t n, int64_t k,
                   float* y, int64_t ldy, bool accumulate = false);

}  // namespace deltaserve::kernels
