#include "kernels/reference/kda_ref.h"

#include <cmath>
#include <vector>

namespace deltaserve::kernels::ref {

void KdaRecurrent(const KdaShape& shape, const double* q, const double* k, const double* v,
                  const double* g, const double* beta, double scale, double* state, double* o) {
  const int64_t hk = shape.heads, hv = shape.v_heads;
  const int64_t kd = shape.k_dim, vd = shape.v_dim;
  const int64_t group = hv / hk;
  std::vector<double> u(vd);
  for (int64_t t = 0; t < shape.t; ++t) {
    for (int64_t j = 0; j < hv; ++j) {
      const double* qt = q + (t * hk + j / group) * kd;  // [K]
      const double* kt = k + (t * hk + j / group) * kd;  // [K]
      const double* vt = v + (t * hv + j) * vd;          // [V]
      const double* gt = g + (t * hv + j) * kd;          // [K]
      const double b = beta[t * hv + j];
      double* s = state + j * kd * vd;  // [K, V]
      double* ot = o + (t * hv + j) * vd;
      for (int64_t c = 0; c < kd; ++c) {
        for (int64_t e = 0; e < vd; ++e) s[c * vd + e] *= std::exp(gt[c]);
      }
      for (int64_t e = 0; e < vd; ++e) {
        double read = 0.0;
        for (int64_t c = 0; c < kd; ++c) read += s[c * vd + e] * kt[c];
        u[e] = vt[e] - read;
      }
      for (int64_t c = 0; c < kd; ++c) {
        for (int64_t e = 0; e < vd; ++e) s[c * vd + e] += b * kt[c] * u[e];
      }
      for (int64_t e = 0; e < vd; ++e) {
        double acc = 0.0;
        for (int64_t c = 0; c < kd; ++c) acc += s[c * vd + e] * scale * qt[c];
        ot[e] = acc;
      }
    }
  }
}

}  // namespace deltaserve::kernels::ref
