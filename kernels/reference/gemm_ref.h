// Float64 reference for kernels/gemm.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// y[m, n] = x[m, k] · w[n, k]ᵀ.
void Linear(const double* x, const double* w, int64_t m, int64_t n, int64_t k, double* y);

}  // namespace deltaserve::kernels::ref
