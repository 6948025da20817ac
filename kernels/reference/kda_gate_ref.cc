#include "kernels/reference/kda_gate_ref.h"

#include <cmath>

namespace deltaserve::kernels::ref {

void KdaGateLowerBound(const double* graw, const double* dt_bias, const double* a_log, int64_t t,
                       int64_t heads, int64_t head_dim, double lower_bound, double* g) {
  const int64_t width = heads * head_dim;
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t c = 0; c < width; ++c) {
      const double z = std::exp(a_log[c / head_dim]) * (graw[s * width + c] + dt_bias[c]);
      g[s * width + c] = lower_bound / (1.0 + std::exp(-z));
    }
  }
}

void KdaGateSoftplus(const double* graw, const double* dt_bias, const double* a_log, int64_t t,
                     int64_t heads, int64_t head_dim, double* g) {
  const int64_t width = heads * head_dim;
  for (int64_t s = 0; s < t; ++s) {
    for (int64_t c = 0; c < width; ++c) {
      const double z = graw[s * width + c] + dt_bias[c];
      const double softplus = z > 20.0 ? z : std::log1p(std::exp(z));
      g[s * width + c] = -std::exp(a_log[c / head_dim]) * softplus;
    }
  }
}

}  // namespace deltaserve::kernels::ref
