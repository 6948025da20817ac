#include "kernels/reference/norm_ref.h"

#include <cmath>

namespace deltaserve::kernels::ref {

void RmsNorm(const double* x, const double* w, int64_t rows, int64_t dim, double eps, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * dim;
    double* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i] * xr[i];
    const double rms = std::sqrt(sum / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      yr[i] = xr[i] / rms * (w != nullptr ? w[i] : 1.0);
    }
  }
}

void L2Norm(const double* x, int64_t rows, int64_t dim, double eps, double scale, double* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x + r * dim;
    double* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += xr[i] * xr[i];
    const double norm = std::sqrt(sum + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] / norm * scale;
  }
}

}  // namespace deltaserve::kernels::ref
