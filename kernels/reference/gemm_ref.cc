#include "kernels/reference/gemm_ref.h"

namespace deltaserve::kernels::ref {

void Linear(const double* x, const double* w, int64_t m, int64_t n, int64_t k, double* y) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t c = 0; c < k; ++c) acc += x[i * k + c] * w[j * k + c];
      y[i * n + j] = acc;
    }
  }
}

}  // namespace deltaserve::kernels::ref
