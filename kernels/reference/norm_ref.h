// Float64 reference for kernels/norm.h.
#pragma once

#include <cstdint>

namespace deltaserve::kernels::ref {

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w (w may be null).
void RmsNorm(const double* x, const double* w, int64_t rows, int64_t dim, double eps, double* y);

// y[r, :] = x[r, :] / sqrt(sum(x[r, :]²) + eps) * scale.
void L2Norm(const double* x, int64_t rows, int64_t dim, double eps, double scale, double* y);

}  // namespace deltaserve::kernels::ref
